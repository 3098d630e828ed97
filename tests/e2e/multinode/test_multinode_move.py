"""A two-node job moved to two other nodes (issue 14): `orch resume --on A --on B` copies the
job to the new nodes (the checkpoint to the first; the trainer fans it out to the other, no
shared disk) and the run ends bit-identical to one never interrupted. The new "servers" are the
same namespaces under other roots (tests/support/netns.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from tests.e2e.multinode.test_multinode import two_nodes  # noqa: F401 (a fixture)
from tests.e2e.multinode.test_multinode_resume import complete_steps, final_weights, job_folder, resume_spec
from tests.support.netns import Cluster
from tests.support.orch import Orch
from tests.support.poll import wait_until

STEPS = 12


def test_a_two_node_job_moves_to_two_other_nodes_bit_identical(
        orch: Orch, two_nodes: list[str], cluster: Cluster, tiny_assets: Path) -> None:  # noqa: F811
    moved_to = []
    for node in cluster.nodes:
        name = node.name + "-b"
        orch("hosts", "add", name, "--ssh", f"ssh root@{node.address}", "--identity", str(cluster.client_key),
             "--root", str(orch.remote_root / name), "--python", sys.executable, "--trust")
        moved_to.append(name)
    spec = resume_spec(orch, tiny_assets, two_nodes, 1, "lora", "straight", slow=False)
    straight = json.loads(orch("submit", str(spec), "--follow", "--json", timeout=600).stdout)
    assert straight["state"] == "succeeded", straight

    job = orch.json("submit", str(resume_spec(orch, tiny_assets, two_nodes, 1, "lora", "moved")))["job_id"]
    wait_until(lambda: any(complete_steps(job_folder(orch, n, job)) for n in two_nodes),
               what="a checkpoint", timeout=300)
    orch("cancel", job, timeout=300)
    step = max(s for n in two_nodes for s in complete_steps(job_folder(orch, n, job)))
    assert step < STEPS, "the run ended before it could be moved"

    out = orch("resume", job, "--on", moved_to[0], "--on", moved_to[1], "--follow", timeout=600)
    assert f"checkpoint checkpoints/step-{step}" in out.stderr
    status = orch.json("status", job)
    assert status["state"] == "succeeded" and status["hosts"] == moved_to
    first, second = (job_folder(orch, n, job) for n in moved_to)
    assert (first / "code").is_dir() and (second / "code").is_dir()
    assert step in complete_steps(first) and step in complete_steps(second)  # sent to one, fanned out to the other
    a, b = final_weights(orch, straight["job_id"]), final_weights(orch, job)
    assert a.keys() == b.keys() and a and all(torch.equal(a[k], b[k]) for k in a)

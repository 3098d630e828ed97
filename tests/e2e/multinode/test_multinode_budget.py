"""``max_cost`` across two network namespaces (issue 37, budgets): each node's supervisor counts
the whole job's cost (both nodes' prices) on its own and stops and powers off its own part, so
the job ends ``cancelled`` with the budget's reason and both boxes power off, laptop gone."""

from __future__ import annotations

import json
import re
import sys

from tests.support.netns import Cluster
from tests.support.orch import TICKER, Orch
from tests.support.poll import wait_until

PRICE = 360.0  # per node and hour: the job costs 0.20 a second
MAX_COST = 8.0  # 40 s: torchrun's workers install their SIGTERM handler long before


def test_every_node_stops_and_powers_off_its_own_part_at_the_jobs_budget(orch: Orch, cluster: Cluster) -> None:
    names = []
    for node in cluster.nodes:
        orch("hosts", "add", node.name, "--ssh", f"ssh root@{node.address}", "--identity", str(cluster.client_key),
             "--root", str(orch.remote_root / node.name), "--python", sys.executable, "--trust",
             "--price-per-hour", str(PRICE))
        names.append(node.name)
    ws = orch.cwd / "ws"
    ws.mkdir()
    (ws / "tick.py").write_text(TICKER.replace('f"checkpoint-{attempt}"', 'f"checkpoint-{attempt}-rank{os.environ[\'RANK\']}"'))
    off = orch.cwd / "powered-off"
    spec = orch.cwd / "capped.yaml"
    spec.write_text(json.dumps({"name": "capped", "hosts": names, "workspace": {"path": "ws"}, "max_cost": MAX_COST,
                                "launch": {"nproc_per_node": 1, "command": "python tick.py"},
                                "on_finish": {"power_off": True, "shutdown_command": ["sh", "-c", f"echo off >> {off}"]}}))
    job = orch.json("submit", str(spec), timeout=600)["job_id"]

    wait_until(lambda: off.exists() and len(off.read_text().split()) == 2, what="both nodes to power off",
               timeout=300, interval=0.5)
    status = orch.json("status", job)
    assert status["state"] == "cancelled", status
    assert re.match(rf"node \d: stopped: max_cost {MAX_COST:.2f} reached \(", status["reason"]), status["reason"]
    assert "720/h for " in status["reason"]  # both nodes' price
    for rank, name in enumerate(names):
        job_dir = orch.remote_root / name / "jobs" / job
        node = json.loads((job_dir / "status.json").read_text())
        assert node["state"] == "cancelled" and node["budget_reached"] is True, (name, node)
        assert (job_dir / "outputs" / f"checkpoint-1-rank{rank}").exists(), name  # SIGTERM reached the worker

"""A launcher inside launch.command across two network namespaces (issue 22): `accelerate
launch` runs once per node, 2 nodes × 2 processes, with each node's rank and the first node's
address; deepspeed the same way, in its --no_ssh mode with orch's hostfile (its argv per node as
--dry-run prints it, then the run)."""

from __future__ import annotations

import json

from tests.e2e.multinode.test_multinode import two_nodes  # noqa: F401 (fixture)
from tests.support.netns import Cluster
from tests.support.orch import Orch
from tests.support.scripts import ACCELERATE, DEEPSPEED


def _spec(orch: Orch, name: str, hosts: list[str], command: str) -> str:
    ws = orch.cwd / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "a.py").write_text(ACCELERATE)
    (ws / "d.py").write_text(DEEPSPEED)
    spec = orch.cwd / f"{name}.yaml"
    spec.write_text(json.dumps({"name": name, "hosts": hosts, "workspace": {"path": "ws"},
                                "launch": {"nproc_per_node": 2, "command": command},
                                "outputs": ["outputs/"]}))
    return str(spec)


def test_accelerate_across_two_nodes(orch: Orch, two_nodes: list[str], cluster: Cluster) -> None:  # noqa: F811
    spec = _spec(orch, "acc2", two_nodes, "accelerate launch --num_machines 1 a.py --cpu")
    assert "asks for 1 node(s) but the job has 2" in orch("check", spec).stdout
    job = json.loads(orch("submit", spec, "--follow", "--json", timeout=600).stdout)
    assert job["state"] == "succeeded", job
    orch("fetch", job["job_id"])
    out = orch.cwd / "runs" / job["job_id"] / "outputs"
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert all(r["world"] == 4 and r["sum"] == 10 and "MULTI_CPU" in r["type"] for r in ranks)


def test_deepspeed_across_two_nodes(orch: Orch, two_nodes: list[str], cluster: Cluster) -> None:  # noqa: F811
    """Its --no_ssh mode on each node with orch's hostfile; the command's own --hostfile is dropped."""
    spec = _spec(orch, "ds2", two_nodes, "deepspeed --hostfile /etc/hosts d.py")
    plan = json.loads(orch("submit", spec, "--dry-run").stdout)
    first = cluster.nodes[0].address
    for rank, node in enumerate(plan["nodes"]):
        argv = node["argv"]
        assert argv[1:3] == ["-m", "deepspeed.launcher.runner"] and argv[-1] == "d.py"
        flags = argv[3:-1]
        assert flags[:12] == ["--num_gpus", "2", "--num_nodes", "2", "--node_rank", str(rank), "--master_addr",
                              first, "--master_port", flags[9], "--no_ssh", "--hostfile"]
        assert flags[12] == f"{node['job_dir']}/deepspeed_hostfile" and "/etc/hosts" not in argv
    job = json.loads(orch("submit", spec, "--follow", "--json", timeout=600).stdout)
    assert job["state"] == "succeeded", job
    orch("fetch", job["job_id"])
    out = orch.cwd / "runs" / job["job_id"] / "outputs"
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert [(r["rank"], r["world"], r["local_rank"]) for r in ranks] == [(0, 4, "0"), (1, 4, "1"), (2, 4, "0"),
                                                                       (3, 4, "1")]

"""One job across two network namespaces (issue 5): 2 nodes × 2 processes of the built-in
trainer under torchrun's c10d rendezvous; equal to 1 node × 4; a killed node fails the job
and leaves nothing running; cancel stops both."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from remote_payload.jobdir.processes import group_alive
from tests.support.netns import Cluster
from tests.support.orch import Orch, exact_workspace, release, submit_paused


@pytest.fixture
def two_nodes(orch: Orch, cluster: Cluster) -> list[str]:
    names = []
    for node in cluster.nodes:
        orch("hosts", "add", node.name, "--ssh", f"ssh root@{node.address}", "--identity", str(cluster.client_key),
             "--root", str(orch.remote_root / node.name), "--python", sys.executable, "--trust")
        names.append(node.name)
    return names


def train_spec(orch: Orch, assets: Path, hosts: list[str], nproc: int, max_steps: int, name: str) -> Path:
    exact_workspace(orch.cwd, assets)
    spec = orch.cwd / f"{name}.yaml"
    spec.write_text(json.dumps({
        "name": name, "hosts": hosts, "workspace": {"path": "ws"}, "launch": {"nproc_per_node": nproc},
        "train": {"model": "assets/tiny-gpt2", "finetune": "lora",
                  "lora": {"r": 4, "dropout": 0.0, "target_modules": ["c_attn"]},
                  "data": {"train": "assets/data/train.jsonl", "max_length": 48}, "precision": "fp32",
                  "batch_size": 2, "max_steps": max_steps, "save_every": 1000, "eval_every": 1000, "log_every": 1},
    }))
    return spec


def test_two_nodes_train_like_one_node_with_four_processes(orch: Orch, two_nodes: list[str], tiny_assets: Path) -> None:
    multi = json.loads(orch("submit", str(train_spec(orch, tiny_assets, two_nodes, 2, 6, "two")), "--follow", "--json",
                            timeout=600).stdout)
    assert multi["state"] == "succeeded", multi
    single = json.loads(orch("submit", str(train_spec(orch, tiny_assets, ["local"], 4, 6, "one")), "--follow", "--json",
                             timeout=600).stdout)
    assert single["state"] == "succeeded"
    for result in (multi, single):
        orch("fetch", result["job_id"])
    runs = orch.cwd / "runs"
    a = load_file(runs / multi["job_id"] / "outputs" / "adapter_model.safetensors")
    b = load_file(runs / single["job_id"] / "outputs" / "adapter_model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)
    logs = sorted(p.name for p in (runs / multi["job_id"] / "logs").iterdir())
    assert {"node0.log", "node1.log"} <= set(logs)
    merged = orch("logs", multi["job_id"]).stdout
    assert "[node 0] " in merged and "[node 1] " in merged
    status = orch.json("status", multi["job_id"])
    assert [n["state"] for n in status["nodes"]] == ["succeeded", "succeeded"]


def _node_status(orch: Orch, job: str) -> list[dict]:
    return orch.json("status", job).get("nodes") or []


def test_a_killed_node_fails_the_job_and_nothing_keeps_running(orch: Orch, two_nodes: list[str], tiny_assets: Path) -> None:
    job = orch.json("submit", str(train_spec(orch, tiny_assets, two_nodes, 2, 100000, "killnode")))["job_id"]
    metrics = orch.remote_root / "node1" / "jobs" / job / "metrics.jsonl"
    metrics2 = orch.remote_root / "node2" / "jobs" / job / "metrics.jsonl"
    deadline = time.time() + 300
    while not (metrics.exists() or metrics2.exists()) and time.time() < deadline:
        time.sleep(0.5)
    nodes = _node_status(orch, job)
    assert [n["state"] for n in nodes] == ["running", "running"]
    victim = nodes[1]
    os.kill(victim["supervisor_pid"], signal.SIGKILL)
    os.killpg(victim["pgid"], signal.SIGKILL)
    started = time.time()
    status = orch.wait_state(job, ("failed", "lost", "cancelled", "succeeded"), timeout=120)
    assert status["state"] in ("failed", "lost") and time.time() - started < 120
    survivor = _node_status(orch, job)[0]
    assert survivor["state"] in ("failed", "cancelled")
    deadline = time.time() + 30
    while group_alive(survivor["pgid"]) and time.time() < deadline:
        time.sleep(0.2)
    assert not group_alive(survivor["pgid"])


def test_cancel_stops_every_node(orch: Orch, two_nodes: list[str], tiny_assets: Path) -> None:
    job = orch.json("submit", str(train_spec(orch, tiny_assets, two_nodes, 2, 100000, "cancelboth")))["job_id"]
    status = orch.wait_state(job, ("running",), timeout=300)
    assert status["state"] == "running"
    time.sleep(3)
    nodes = _node_status(orch, job)
    out = orch("cancel", job, "--grace", "20")
    assert out.stdout.strip().endswith("cancelled")
    final = _node_status(orch, job)
    assert [n["state"] for n in final] == ["cancelled", "cancelled"]
    for node in nodes:
        assert not group_alive(node["pgid"])


RELATIVE = """\
import os, pathlib
os.makedirs("outputs", exist_ok=True)
rank = os.environ["RANK"]
pathlib.Path(f"outputs/rank{rank}.txt").write_text(rank)
if rank == "0":
    pathlib.Path("outputs/final.txt").write_text("written by rank 0")
"""


def test_relative_outputs_of_a_multi_node_user_script_are_fetched_from_every_node(
        orch: Orch, two_nodes: list[str]) -> None:
    ws = orch.cwd / "ws"
    ws.mkdir()
    (ws / "write.py").write_text(RELATIVE)
    spec = orch.cwd / "rel.yaml"
    spec.write_text(json.dumps({"name": "rel", "hosts": two_nodes, "workspace": {"path": "ws"},
                                "launch": {"nproc_per_node": 2, "command": "python write.py"}}))
    job = json.loads(orch("submit", str(spec), "--follow", "--json", timeout=600).stdout)
    assert job["state"] == "succeeded", job
    orch("fetch", job["job_id"])
    out = orch.cwd / "runs" / job["job_id"] / "outputs"
    assert (out / "final.txt").read_text() == "written by rank 0"
    assert sorted(p.name for p in out.glob("rank*.txt")) == [f"rank{r}.txt" for r in range(4)]


def test_every_node_runs_the_tree_its_own_submit_sent_when_another_submit_syncs_before_the_launch(
        orch: Orch, two_nodes: list[str], tmp_path: Path) -> None:
    """Issue 23, 2 on a multi-node job: alpha synced version 1 to both nodes; the code is
    edited and beta, a job file of the same checkout, syncs version 2 to both before alpha
    launches; every node of alpha runs version 1."""
    ws = orch.cwd / "ws"
    ws.mkdir()
    (ws / "main.py").write_text("print('CODE VERSION 1')\n")
    specs = {}
    for name in ("alpha", "beta"):
        specs[name] = orch.cwd / f"{name}.yaml"
        specs[name].write_text(json.dumps({"name": name, "hosts": two_nodes, "workspace": {"path": "ws"},
                                           "launch": {"nproc_per_node": 1, "command": "python main.py"}}))
    first = submit_paused(orch, specs["alpha"], "after-sync", tmp_path / "hooks")
    (ws / "main.py").write_text("print('CODE VERSION 2')\n")
    beta = json.loads(orch("submit", str(specs["beta"]), "--follow", "--json", timeout=600).stdout)
    assert beta["state"] == "succeeded", beta
    code, out, err = release(first, "after-sync", tmp_path / "hooks", timeout=600)
    assert code == 0, err
    alpha = json.loads(out)["job_id"]
    assert orch.wait_state(alpha, ("succeeded", "failed"), timeout=600)["state"] == "succeeded"
    for node in two_nodes:
        job = orch.remote_root / node / "jobs" / alpha
        assert (job / "code" / "main.py").read_text() == "print('CODE VERSION 1')\n", node
        printed = "".join(p.read_text() for p in (job / "logs").glob("node*.log"))
        assert "CODE VERSION 1" in printed and "CODE VERSION 2" not in printed, node

"""The GPU queue's rules without the CLI: what a job asks for (plan), what fits (gpuqueue), the
strict FIFO pass over real holder processes, a dead holder freed, nvidia-smi's text read
defensively, and the Slurm refusal."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator
from unittest.mock import patch

import pytest

from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import Host
from orchestrator.jobs.nodes import aggregate
from orchestrator.plan.build import HostFacts, build_plan, queue_request
from orchestrator.spec.model import JobSpec
from remote_payload.contract.jobfolder import atomic_write_json
from remote_payload.gpuqueue import inventory as gpuinventory
from remote_payload.gpuqueue import queue as gpuqueue
from remote_payload.jobdir.processes import boot_id

JOB = "t-20261129-101500-abcd"
BOX = Host(name="box", address="203.0.113.7")


def spec(env: dict[str, str] | None = None, **launch: Any) -> JobSpec:
    return JobSpec.model_validate({"name": "t", "hosts": ["box"], "env": env or {},
                                   "launch": {"command": ["python", "train.py"], **launch}})


@pytest.mark.parametrize("launch, env, expected", [
    ({}, None, {"gpus": "all", "memory_gb": None, "priority": 0, "pinned": None}),
    ({"nproc_per_node": 2}, None, {"gpus": 2, "memory_gb": None, "priority": 0, "pinned": None}),
    ({"gpus": 1, "memory_gb": 40, "priority": 5}, None, {"gpus": 1, "memory_gb": 40.0, "priority": 5, "pinned": None}),
    ({"nproc_per_node": 1, "gpus": 3}, None, {"gpus": 3, "memory_gb": None, "priority": 0, "pinned": None}),
    ({"gpus": 0, "nproc_per_node": 2}, None, None),  # a CPU job never queues
    ({}, {"CUDA_VISIBLE_DEVICES": "3,1"}, {"gpus": 2, "memory_gb": None, "priority": 0, "pinned": [3, 1]}),
    ({}, {"CUDA_VISIBLE_DEVICES": ""}, None),
    ({}, {"CUDA_VISIBLE_DEVICES": "GPU-8f2c"}, None),  # the job picks its devices itself
])
def test_what_a_job_queues_for(launch: dict[str, Any], env: dict[str, str] | None, expected: Any) -> None:
    assert queue_request(spec(env, **launch)) == expected


def test_the_request_reaches_job_json_and_auto_processes_follow_launch_gpus() -> None:
    facts = HostFacts(python="/usr/bin/python3", root="/r", gpus=8)
    plan = build_plan(spec(gpus=2, priority=-3), "text", "/l", "p", [BOX], [facts], JOB)
    assert plan.job_json()["queue"] == {"gpus": 2, "memory_gb": None, "priority": -3, "pinned": None}
    assert plan.nodes[0].nproc == 2 and "--nproc_per_node" in plan.nodes[0].argv
    with pytest.raises(UsageError, match="launch.gpus is 9 but"):
        build_plan(spec(gpus=9), "text", "/l", "p", [BOX], [facts], JOB)
    with pytest.raises(UsageError, match="names 1 GPU"):
        queue_request(spec({"CUDA_VISIBLE_DEVICES": "0"}, gpus=2))
    with pytest.raises(ValueError, match="each process needs a GPU of its own"):
        spec(nproc_per_node=4, gpus=2)


def test_on_a_slurm_host_the_queue_fields_are_refused_and_the_plan_has_no_queue() -> None:
    lab = Host(name="lab", address="login", scheduler="slurm", root="/shared")
    facts = HostFacts(python="/usr/bin/python3", root="/shared", payload="/shared/payload",
                      slurm={"partitions": {"gpu": {"default": True, "max_gpus_per_node": 4}}})
    for launch in ({"gpus": 2}, {"priority": 1}, {"memory_gb": 10}):
        with pytest.raises(UsageError, match="Slurm cluster, whose own queue decides: ask for GPUs with "
                                             "launch.slurm.gpus_per_node"):
            build_plan(spec(**launch), "text", "/l", "p", [lab], [facts], JOB)
    plan = build_plan(spec(), "text", "/l", "p", [lab], [facts], JOB)
    assert plan.queue is None and plan.slurm is not None


def test_never_fits_names_the_shortfall() -> None:
    gpus = [{"index": i, "uuid": f"u{i}", "total_mib": 24 * 1024, "used_mib": 0, "apps": 0} for i in range(2)]
    assert "needs 3 GPU(s); this host has 2" in gpuqueue.never_fits({"gpus": 3}, gpus)
    assert "with 40 GB each; this host has 0" in gpuqueue.never_fits({"gpus": 1, "memory_gb": 40}, gpus)
    assert "names GPU 5" in gpuqueue.never_fits({"gpus": 1, "pinned": [5]}, gpus)
    assert gpuqueue.never_fits({"gpus": "all", "memory_gb": 20}, gpus) is None


@pytest.fixture
def holders() -> Iterator[Any]:
    """Start stand-in supervisors: real processes whose command line names ``supervisor`` and the job."""
    procs: list[subprocess.Popen] = []

    def start(job_id: str) -> int:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "supervisor.py", job_id])
        procs.append(proc)
        return proc.pid

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def entry(root: Path, job_id: str, pid: int, need: Any, since: float, state: str = "waiting",
          gpus: list[int] | None = None, priority: int = 0) -> Path:
    path = Path(gpuqueue.entry_path(str(root), job_id, 0))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(str(path), {"job_id": job_id, "node_rank": 0, "pid": pid, "boot_id": boot_id(),
                                  "job_dir": f"/r/jobs/{job_id}", "state": state, "priority": priority,
                                  "since": since, "need": {"gpus": need}, "gpus": gpus or []})
    return path


def fake(n: int, busy: str = "") -> list[dict[str, Any]]:
    return gpuinventory._fake({"gpus": n, "busy": [int(i) for i in busy.split(",") if i], "memory_gb": 80})


def test_strict_fifo_no_backfill_priority_first_and_dead_holders_freed(tmp_path: Path, holders: Any) -> None:
    t = time.time()
    entry(tmp_path, "a", holders("a"), 1, t, "running", [0])
    entry(tmp_path, "big", holders("big"), 2, t + 1)     # the head: needs both GPUs
    entry(tmp_path, "small", holders("small"), 1, t + 2)  # would fit now, but waits behind the head
    with gpuqueue.locked(str(tmp_path)):
        seen = gpuqueue.schedule(str(tmp_path), fake(2))
    assert seen["positions"] == {"big.node0.json": 1, "small.node0.json": 2} and seen["free"] == [1]
    entry(tmp_path, "urgent", holders("urgent"), 1, t + 3, priority=5)  # jumps the line, gets GPU 1
    with gpuqueue.locked(str(tmp_path)):
        seen = gpuqueue.schedule(str(tmp_path), fake(2))
    assert json.loads(Path(gpuqueue.entry_path(str(tmp_path), "urgent", 0)).read_text())["gpus"] == [1]
    assert seen["positions"] == {"big.node0.json": 1, "small.node0.json": 2}
    dead = subprocess.Popen([sys.executable, "-c", "pass", "supervisor.py", "gone"])
    dead.wait()
    ghost = entry(tmp_path, "gone", dead.pid, 1, t - 10, "running", [1])  # a killed supervisor's entry
    with gpuqueue.locked(str(tmp_path)):
        gpuqueue.schedule(str(tmp_path), fake(2))
    assert not ghost.exists()


def test_busy_gpus_are_never_handed_out_and_no_gpu_is_granted_twice(tmp_path: Path, holders: Any) -> None:
    t = time.time()
    for k in range(6):
        entry(tmp_path, f"j{k}", holders(f"j{k}"), 1, t + k)
    with gpuqueue.locked(str(tmp_path)):
        seen = gpuqueue.schedule(str(tmp_path), fake(4, busy="0,2"))
    granted = {p.name: json.loads(p.read_text())["gpus"] for p in (tmp_path / "queue").glob("j*.json")}
    assert sorted(g for gpus in granted.values() for g in gpus) == [1, 3]
    assert seen["busy"] == [0, 2] and seen["positions"] == {"j2.node0.json": 1, "j3.node0.json": 2,
                                                            "j4.node0.json": 3, "j5.node0.json": 4}


def test_nvidia_smi_text_is_read_defensively() -> None:
    answers = {
        "--query-gpu=index,uuid,memory.total,memory.used":
            b"0, GPU-aaa, 81920, 3\n1, GPU-b\x1b[31mb, [N/A], 70000\nnot a row\n\n",
        "--query-compute-apps=gpu_uuid,pid": b"GPU-b\x1b[31mb, 4242\n",
    }

    def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[bytes]:
        return subprocess.CompletedProcess(argv, 0, answers[argv[1]], b"")

    with patch.object(gpuinventory.subprocess, "run", run):
        gpus = gpuinventory._from_smi()
    assert gpus == [{"index": 0, "uuid": "GPU-aaa", "total_mib": 81920, "used_mib": 3, "apps": 0},
                    {"index": 1, "uuid": "GPU-b31mb", "total_mib": None, "used_mib": 70000, "apps": 1}]
    assert [gpuinventory.busy(g) for g in gpus] == [False, True]
    with patch.object(gpuinventory.subprocess, "run", side_effect=FileNotFoundError("nvidia-smi")):
        assert gpuinventory._from_smi() == []


def test_a_multi_node_job_waits_at_its_last_queued_nodes_place() -> None:
    status = aggregate([{"state": "running", "queue_position": None}, {"state": "queued", "queue_position": 3}])
    assert status["state"] == "running" and "queue_position" not in status
    status = aggregate([{"state": "queued", "queue_position": 1}, {"state": "queued", "queue_position": 2}])
    assert status["state"] == "queued" and status["queue_position"] == 2


def test_a_job_that_names_its_gpus_waits_for_exactly_those(tmp_path: Path, holders: Any) -> None:
    t = time.time()
    holder = entry(tmp_path, "a", holders("a"), 1, t, "running", [1])
    pinned = entry(tmp_path, "p", holders("p"), 2, t + 1)
    atomic_write_json(str(pinned), dict(json.loads(pinned.read_text()), need={"gpus": 2, "pinned": [2, 1]}))
    with gpuqueue.locked(str(tmp_path)):
        assert gpuqueue.schedule(str(tmp_path), fake(3))["positions"] == {"p.node0.json": 1}  # 0 is free: not its
    holder.unlink()
    with gpuqueue.locked(str(tmp_path)):
        gpuqueue.schedule(str(tmp_path), fake(3))
    assert json.loads(pinned.read_text())["gpus"] == [2, 1]  # in the order the job named them

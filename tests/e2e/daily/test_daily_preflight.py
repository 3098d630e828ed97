"""Preflight: the real table from the loopback host (no GPU here), blockers for jobs that
need what the host lacks, and the verdict rules on facts a CPU box cannot produce."""

from __future__ import annotations

from pathlib import Path

from orchestrator.checks.preflight import Needs, judge
from orchestrator.checks.verdict import FAIL, OK, WARN
from tests.support.orch import Orch, write_job

TRAIN_FP16 = """name: needs-gpu
hosts: [box]
workspace: {path: ws}
train:
  model: assets/m
  data: {train: assets/train.jsonl}
  precision: fp16
"""


def verdict(rows: list, check: str) -> str:
    return next(r.verdict for r in rows if r.check == check)


def test_hosts_check_on_a_cpu_host_says_there_is_no_gpu(orch: Orch, box: str) -> None:
    out = orch("hosts", "check", "box").stdout
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip()}
    assert "box (root@127.0.0.1:" in out
    assert "none" in lines["GPUs"] and "warn" in lines["GPUs"] and "no GPU: CPU only" in lines["GPUs"]
    assert "2.13.0" in lines["torch"] and "cuda.is_available() False" in lines["torch"]
    for check in ("login", "python", "rsync", "clock"):
        assert " ok" in lines[check], lines[check]
    assert "GB free of" in out and "inodes free" in out and "FAIL" not in out


def test_check_remote_blocks_a_fp16_job_on_a_host_without_gpus(orch: Orch, box: str) -> None:
    (orch.cwd / "ws").mkdir()
    spec = orch.cwd / "gpu.yaml"
    spec.write_text(TRAIN_FP16)
    out = orch("check", str(spec), "--remote", check=4)
    assert "ok — job 'needs-gpu'" in out.stdout and "FAIL" in out.stdout
    assert "blocker" in out.stderr and "needs-gpu asks for fp16/bf16, which needs a GPU" in out.stderr
    assert "Traceback" not in out.stderr


def test_check_remote_passes_a_cpu_job_with_two_processes(orch: Orch, box: str) -> None:
    spec = write_job(orch.cwd, "cpu2", "box", ["python", "-c", "print(1)"])
    spec.write_text(spec.read_text().replace("nproc_per_node: 1", "nproc_per_node: 2"))
    out = orch("check", str(spec), "--remote")
    assert "2 CPU processes" in out.stdout and "FAIL" not in out.stdout


FACTS = {
    "login_shell": "/bin/bash", "user": "root", "python": "/usr/bin/python3", "python_version": "3.10.12",
    "root": "/root/orch", "root_on_system_disk": True,
    "disks": {d: {"free_bytes": 25e9, "total_bytes": 30e9, "free_inodes": 10**6} for d in ("root", "system")},
    "tools": {"rsync": None, "tmux": "/usr/bin/tmux"},
    "gpu": {"nvidia_smi": True, "driver": "550.54", "processes": 1, "gpus": [
        {"index": "0", "name": "NVIDIA A100-SXM4-80GB", "memory_total_mb": 81920, "memory_used_mb": 40000},
        {"index": "1", "name": "NVIDIA A100-SXM4-80GB", "memory_total_mb": 81920, "memory_used_mb": 0}]},
    "torch": {"version": "2.4.0+cu121", "cuda": "12.1", "cuda_available": True, "devices": 2, "bf16": True},
}


def test_verdicts_on_a_gpu_box_with_a_small_system_disk() -> None:
    rows = judge(FACTS, 12.0, Needs(gpu=True, bf16=True, nproc=4, torch=True, job="j"))
    assert verdict(rows, "GPU count") == FAIL  # 4 processes, 2 GPUs
    assert [r.verdict for r in rows if r.check == "GPU"] == [WARN, OK]  # GPU 0 half used by someone else
    assert verdict(rows, "GPU processes") == WARN and verdict(rows, "driver") == OK
    assert verdict(rows, "root placement") == WARN and "data disk" in next(r.note for r in rows if r.check == "root placement")
    assert verdict(rows, "rsync") == WARN and verdict(rows, "clock skew") == WARN
    assert verdict(rows, "torch") == OK and verdict(rows, "python") == OK


def test_verdicts_block_on_old_python_full_disk_missing_torch_and_no_bf16() -> None:
    facts = dict(FACTS, python_version="3.7.9", root_on_system_disk=False,
                 torch={"error": "ModuleNotFoundError: No module named 'torch'"})
    facts["disks"] = dict(FACTS["disks"], root={"free_bytes": 1e9, "total_bytes": 500e9, "free_inodes": 10**6})
    rows = judge(facts, 0.0, Needs(torch=True, job="j"))
    assert verdict(rows, "python") == FAIL and verdict(rows, "torch") == FAIL
    assert next(r for r in rows if r.check.startswith("disk at root")).verdict == FAIL
    assert not any(r.check == "root placement" for r in rows)
    assert verdict(judge(facts, 0.0, Needs()), "torch") == WARN  # no job: only a warning
    no_bf16 = dict(FACTS, torch=dict(FACTS["torch"], bf16=False))
    assert verdict(judge(no_bf16, 0.0, Needs(gpu=True, bf16=True)), "bf16") == FAIL
    assert verdict(judge({}, 0.0, Needs()), "python") == FAIL  # odd facts never raise


def test_needs_of_a_spec_reads_precision_and_processes(tmp_path: Path) -> None:
    from orchestrator.spec.load import load_spec

    (tmp_path / "ws").mkdir()
    spec = tmp_path / "j.yaml"
    spec.write_text(TRAIN_FP16.replace("workspace: {path: ws}", "workspace: {path: ws}\nlaunch: {nproc_per_node: 3}"))
    assert Needs.of(load_spec(spec).spec) == Needs(gpu=True, bf16=False, nproc=3, torch=True, job="needs-gpu")

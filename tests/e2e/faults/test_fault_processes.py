"""Killed supervisors and trainers, a restarted server, a full disk (at sync, at a job's end,
with its supervisor gone), two submits at once (issue 4, faults 5, 6, 8, 9; issue 23, 10)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.orch import Orch, tmpfs, write_job
from tests.support.poll import wait_until
from tests.support.tiers import needs


def train_job(orch: Orch, host: str, assets: Path, max_steps: int = 40) -> Path:
    ws = orch.cwd / "ws"
    shutil.copytree(assets, ws / "assets")
    spec = orch.cwd / "train.yaml"
    spec.write_text(json.dumps({
        "name": "resumable", "hosts": [host], "workspace": {"path": "ws"}, "launch": {"nproc_per_node": 1},
        "train": {"model": "assets/tiny-gpt2", "finetune": "lora", "lora": {"target_modules": ["c_attn"]},
                  "data": {"train": "assets/data/train.jsonl", "max_length": 64}, "precision": "fp32",
                  "batch_size": 4, "max_steps": max_steps, "save_every": 10, "log_every": 5, "eval_every": 1000},
    }))
    return spec


def kill_job(status: dict) -> None:
    """SIGKILL the supervisor and every process of the job's recorded tree (torchrun's
    workers run in sessions of their own)."""
    targets = [(status["supervisor_pid"], os.kill), (status["pgid"], os.killpg)]
    targets += [(pid, os.kill) for pid, _ in status.get("procs") or []]
    for pid, kill in targets:
        try:
            kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_killed_trainer_is_lost_then_resume_continues_from_the_checkpoint(orch: Orch, box: str, tiny_assets: Path) -> None:
    job = orch.json("submit", str(train_job(orch, box, tiny_assets, max_steps=400)))["job_id"]
    ckpt = orch.remote_root / "jobs" / job / "checkpoints"
    wait_until(lambda: (ckpt / "step-10" / "COMPLETE").exists(), what="checkpoint step-10", timeout=120)
    status = orch.json("status", job)
    kill_job(status)
    time.sleep(0.2)
    lost = orch.json("status", job)
    assert lost["state"] == "lost", lost
    resumed = orch("resume", job, "--follow")
    assert "resuming from" in resumed.stdout and "succeeded" in resumed.stderr
    done = orch.json("status", job)
    assert done["state"] == "succeeded" and done["attempt"] == 2
    steps = [json.loads(l)["step"] for l in (ckpt.parent / "metrics.jsonl").read_text().splitlines() if '"loss"' in l]
    assert steps[-1] == 400 and (ckpt.parent / "outputs" / "adapter_model.safetensors").is_file()


RESUMABLE = """\
import os, pathlib, sys, time
out = pathlib.Path(os.environ["ORCH_JOB_DIR"]) / "outputs"
out.mkdir(exist_ok=True)
for i in range(int(sys.argv[1])):
    part = out / f"part-{i:02d}.bin"
    if part.exists():
        continue
    time.sleep(0.3)
    part.with_suffix(".tmp").write_bytes(os.urandom(100_000))
    part.with_suffix(".tmp").rename(part)
    print("wrote", part.name, flush=True)
"""


def test_server_restart_is_lost_then_resume_finishes_and_nothing_is_refetched(orch: Orch, box: str) -> None:
    spec = write_job(orch.cwd, "parts", box, ["python", "parts.py", "40"])
    (orch.cwd / "ws" / "parts.py").write_text(RESUMABLE)
    job = orch.json("submit", str(spec))["job_id"]
    outputs = orch.remote_root / "jobs" / job / "outputs"
    wait_until(lambda: len(list(outputs.glob("part-*.bin"))) >= 4, what="four parts written", timeout=120)
    orch("fetch", job)  # a fetch while it runs
    local = orch.cwd / "runs" / job / "outputs"
    early = {p.name: p.stat().st_mtime_ns for p in local.glob("part-*.bin")}
    assert len(early) >= 4
    status = orch.json("status", job)
    kill_job(status)  # the "restart": every process of the job gone ...
    path = orch.remote_root / "jobs" / job / "status.json"
    on_disk = json.loads(path.read_text())
    path.write_text(json.dumps(dict(on_disk, boot_id="an-earlier-boot")))  # ... and another boot recorded
    lost = orch.json("status", job)
    assert lost["state"] == "lost" and "restarted" in lost["reason"]
    orch("resume", job, "--follow")
    orch("fetch", job)
    assert len(list(local.glob("part-*.bin"))) == 40
    assert {name: (local / name).stat().st_mtime_ns for name in early} == early  # not fetched again


@pytest.fixture
@needs("root")
def tiny_disk(tmp_path: Path) -> Path:
    with tmpfs(tmp_path / "disk", "3m") as mount:
        yield mount


def test_full_disk_fails_clearly_and_freeing_space_recovers(orch: Orch, sshd, tiny_disk: Path) -> None:
    orch("hosts", "add", "small", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(tiny_disk / "orch"), "--python", sys.executable, "--trust")
    spec = write_job(orch.cwd, "fill", "small", ["python", "-c", "print('fits')"])
    big = orch.cwd / "ws" / "data.bin"
    big.write_bytes(os.urandom(4_000_000))
    out = orch("submit", str(spec), check=4)
    assert "No space left on device" in out.stderr and "Traceback" not in out.stderr
    ws = orch.server_workspace(orch.cwd / "ws", tiny_disk / "orch")
    assert not (ws / "data.bin").exists() and not list(ws.glob(".orch-tmp-*"))
    subprocess.run(["mount", "-o", "remount,size=32m", str(tiny_disk)], check=True)
    done = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)
    assert done["state"] == "succeeded"
    assert (ws / "data.bin").read_bytes() == big.read_bytes()


HOG = """\
import os, pathlib
out = pathlib.Path(os.environ['ORCH_JOB_DIR']) / 'outputs'
out.mkdir(exist_ok=True)
try:  # 8 MB, or until the disk is full: the job swallows the error and exits 0
    with open(out / 'huge.bin', 'wb', buffering=0) as f:
        for _ in range(128):
            f.write(os.urandom(65536))
except OSError:
    pass
"""


def test_a_job_that_fills_the_disk_is_never_reported_succeeded(orch: Orch, sshd, tiny_disk: Path) -> None:
    orch("hosts", "add", "small", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(tiny_disk / "orch"), "--python", sys.executable, "--trust")
    spec = write_job(orch.cwd, "hog", "small", ["python", "hog.py"])
    (orch.cwd / "ws" / "hog.py").write_text(HOG)
    result = json.loads(orch("submit", str(spec), "--follow", "--json", check=None).stdout)
    job = result["job_id"]
    status = orch.json("status", job)
    assert status["state"] == "failed", status  # exit 0, but its end met a full disk: never succeeded, never lost
    assert "disk full" in status["reason"] and str(tiny_disk / "orch" / "jobs" / job) in status["reason"]
    assert list((tiny_disk / "orch").rglob("*.tmp.*")) == []  # nothing half-written left behind
    assert json.loads((tiny_disk / "orch" / "jobs" / job / "status.json").read_text())["state"] == "failed"
    shown = orch("status", job, env={"COLUMNS": "80"}).stdout
    assert "failed" in shown and "disk full" in shown
    subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_disk)], check=True)
    orch("resume", job, "--follow")
    assert orch.json("status", job)["state"] == "succeeded"
    assert not list((tiny_disk / "orch").rglob("*.tmp.*"))


def test_a_supervisor_gone_while_the_disk_is_full_shows_failed_not_lost(orch: Orch, sshd, tiny_disk: Path) -> None:
    orch("hosts", "add", "small", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(tiny_disk / "orch"), "--python", sys.executable, "--trust")
    spec = write_job(orch.cwd, "hog", "small", ["python", "hog.py"])
    (orch.cwd / "ws" / "hog.py").write_text(HOG + "(out / 'full').exists() or open(out / 'full', 'w')\n"
                                            "import time; time.sleep(300)\n")
    job = orch.json("submit", str(spec))["job_id"]
    folder = tiny_disk / "orch" / "jobs" / job
    wait_until((folder / "outputs" / "full").exists, what="the job to fill the disk", timeout=120, interval=0.2)
    st = json.loads((folder / "status.json").read_text())
    for pid in [st["supervisor_pid"]] + [p[0] for p in st.get("procs") or []]:  # nothing left to record the end
        os.kill(pid, signal.SIGKILL)
    status = orch.json("status", job)
    assert status["state"] == "failed" and "disk full" in status["reason"] and str(folder) in status["reason"]


def test_two_submits_at_once_to_one_host(orch: Orch, box: str) -> None:
    specs = []
    for name in ("alpha", "beta"):
        d = orch.cwd / name
        d.mkdir()
        specs.append(write_job(d, name, box, ["python", "-c", f"import time; time.sleep(2); print('{name} done')"]))
    procs = [subprocess.Popen([sys.executable, "-m", "orchestrator", "submit", str(s), "--follow", "--json"],
                              cwd=orch.cwd, env=orch.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for s in specs]
    time.sleep(3)
    listing = orch.json("ls")
    results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert [r["state"] for r in results] == ["succeeded", "succeeded"]
    assert len({r["job_id"] for r in results}) == 2 and len(listing) <= 2
    final = {j["job_id"]: j["state"] for j in orch.json("ls")}
    assert final == {r["job_id"]: "succeeded" for r in results}
    for r in results:
        name = r["job_id"].split("-")[0]
        assert f"{name} done" in (orch.remote_root / "jobs" / r["job_id"] / "logs" / "node0.log").read_text()

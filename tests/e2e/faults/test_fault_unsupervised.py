"""A job whose supervisor alone was killed (OOM killer, a stray kill) keeps training: it is
never `lost` while its processes run, `resume` never starts a second copy beside it, and
`cancel` stops every process of every attempt."""

from __future__ import annotations

import json
import os
import signal
import time

from remote_payload.jobdir import processes
from tests.support.orch import TICKER, Orch, write_job


def start_ticker(orch: Orch, host: str, name: str, ticks: int) -> tuple[str, dict]:
    spec = write_job(orch.cwd, name, host, ["python", "tick.py", str(ticks)])
    (orch.cwd / "ws" / "tick.py").write_text(TICKER)
    job = orch.json("submit", str(spec))["job_id"]
    status = orch.wait_state(job, ("running",))
    deadline = time.time() + 60
    while not any("tick.py" in open(f"/proc/{p}/cmdline").read() for p, _ in status.get("procs") or []
                  if os.path.exists(f"/proc/{p}")):
        assert time.time() < deadline, status
        time.sleep(0.3)
        status = orch.json("status", job)
    return job, status


def alive_procs(status: dict) -> list:
    return processes.alive([(int(p), int(t)) for p, t in status.get("procs") or []])


def test_a_job_whose_supervisor_died_is_running_unsupervised_and_resume_runs_one_copy(orch: Orch, host: str) -> None:
    job, status = start_ticker(orch, host, "orphan", 100_000)
    os.kill(status["supervisor_pid"], signal.SIGKILL)
    time.sleep(0.5)
    now = orch.json("status", job)
    assert now["state"] == "running" and now["unsupervised"] is True and "still run" in now["reason"], now
    table = orch("status", "--wide").stdout
    assert "running (unsupervised)" in table and "lost" not in table
    survivors = alive_procs(status)
    assert survivors
    orch("resume", job)
    assert processes.alive(survivors) == []  # the first attempt was stopped and waited for ...
    outputs = orch.job_dir(job) / "outputs"
    assert (outputs / "checkpoint-1").exists()  # ... after its SIGTERM, so it could checkpoint
    deadline = time.time() + 60
    while not list(outputs.glob("attempt-2-*")):
        assert time.time() < deadline
        time.sleep(0.2)
    second = orch.wait_state(job, ("running",))
    assert not second.get("unsupervised")
    assert len([p for p in outputs.glob("attempt-*")]) == 2
    final = orch("cancel", job, "--grace", "10")
    assert final.stdout.strip().endswith("cancelled")
    assert alive_procs(second) == [] and alive_procs(status) == []


def test_cancel_stops_the_processes_of_a_job_whose_supervisor_died(orch: Orch, host: str) -> None:
    job, status = start_ticker(orch, host, "orphan2", 100_000)
    os.kill(status["supervisor_pid"], signal.SIGKILL)
    survivors = alive_procs(status)
    assert survivors
    out = orch("cancel", job, "--grace", "10")
    assert out.stdout.strip().endswith("cancelled")
    assert processes.alive(survivors) == []
    assert orch.json("status", job)["state"] == "cancelled"
    ended = orch.json("status", job)
    assert json.dumps(ended).count("unsupervised") == 0

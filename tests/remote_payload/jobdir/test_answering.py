"""jobdir/answering.py through the helper's probe (helper/agent.py): a job folder whose
status.json names a real process as its supervisor — stopped with SIGSTOP, sleeping, or a
zombie — reads with that process's state from /proc, and as not answering once its
heartbeat is several beats old; the job keeps its state. The whole path through the CLI with
a real supervisor: tests/e2e/faults/test_fault_silent_supervisor.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from remote_payload.helper.agent import Agent
from remote_payload.jobdir import answering, processes
from remote_payload.jobdir.processes import boot_id
from tests.support.poll import wait_until

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)", "supervisor.py"]


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(SLEEPER)
    wait_until(lambda: processes.pid_alive(proc.pid, "supervisor"), what="the sleeper's command line", timeout=60)
    try:
        yield proc
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


def job_with(root: Path, pid: int, age_s: float, **extra: Any) -> str:
    job = root / "jobs" / "silent-1"
    job.mkdir(parents=True, exist_ok=True)
    (job / "job.json").write_text(json.dumps({"job_id": "silent-1", "heartbeat_s": 2.0}))
    (job / "status.json").write_text(json.dumps(dict(
        {"job_id": "silent-1", "state": "running", "supervisor_pid": pid, "boot_id": boot_id(),
         "heartbeat": time.time() - age_s}, **extra)))
    return "silent-1"


def test_the_bound_is_five_beats_and_never_under_ten_seconds() -> None:
    assert answering.silent_after(2.0) == 10.0 and answering.silent_after(0.01) == 10.0
    assert answering.silent_after(30) == 150.0
    assert answering.silent_after("junk") == answering.silent_after(None) == 10.0  # job.json is untrusted


def test_a_stopped_supervisor_reads_stopped_and_not_answering_once_its_heartbeat_is_old(
        tmp_path: Path, sleeper: subprocess.Popen) -> None:
    agent = Agent(str(tmp_path), str(tmp_path))
    os.kill(sleeper.pid, signal.SIGSTOP)
    wait_until(lambda: processes.process_state(sleeper.pid) == "T", what="the sleeper stopped", timeout=60)
    fresh = agent.probe(job_with(tmp_path, sleeper.pid, 1.0))
    assert fresh["state"] == "running" and fresh["supervisor_process"] == "T (stopped)"
    assert "not_answering_s" not in fresh and not fresh.get("reason")  # within its beats: nothing said yet
    old = agent.probe(job_with(tmp_path, sleeper.pid, 43.0))
    assert old["state"] == "running" and old["not_answering_s"] >= 43.0 and old["heartbeat_age_s"] >= 43.0
    assert old["reason"].startswith("supervisor not answering for 43 s: stopped (SIGSTOP"), old
    assert f"kill -CONT {sleeper.pid}" in old["reason"]
    os.kill(sleeper.pid, signal.SIGCONT)
    wait_until(lambda: processes.process_state(sleeper.pid) == "S", what="the sleeper sleeping", timeout=60)
    awake = agent.probe(job_with(tmp_path, sleeper.pid, 43.0))  # alive, sleeping, but writing no heartbeat
    assert awake["supervisor_process"] == "S (sleeping)" and "writes no heartbeat" in awake["reason"]


def test_the_probe_alone_says_whether_a_supervisor_answers(tmp_path: Path, sleeper: subprocess.Popen) -> None:
    """A status.json that claims the probe's fields (written by a job, or an older orch) is not believed."""
    claimed = {"not_answering_s": 999.0, "supervisor_process": "T (stopped)", "heartbeat_age_s": 999.0,
               "reason": None}
    st = Agent(str(tmp_path), str(tmp_path)).probe(job_with(tmp_path, sleeper.pid, 0.5, **claimed))
    assert "not_answering_s" not in st and st["heartbeat_age_s"] < 999
    assert st["supervisor_process"] in ("S (sleeping)", "R (running)")  # the sleeper may still be starting


def test_a_zombie_supervisor_is_named_as_one(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # ended, not reaped: a zombie
        assert processes.process_state(proc.pid) == "Z"
        st = Agent(str(tmp_path), str(tmp_path)).probe(job_with(tmp_path, proc.pid, 43.0))
        assert st["state"] == "lost" and f"its process {proc.pid} exited" in st["reason"] and "zombie" in st["reason"]
    finally:
        proc.wait()

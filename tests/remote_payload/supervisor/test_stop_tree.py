"""A stop of the job's tree (cancel, Slurm's time-limit warning) reaches the running child's
processes and nothing started after the child ended: the real ``Supervisor`` on a real job
folder, its ``_stop_tree`` (the body of the thread a signal handler starts) called where such a
thread may get its turn on a loaded machine. A late look at the tree had killed the ``scontrol
requeue`` a warned Slurm job runs after its step, and the job ended failed instead of requeued."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from remote_payload.supervisor.supervisor import Supervisor

WAIT_S = 60.0  # an upper bound for a process to end on a loaded machine, never a measured time


def supervisor(tmp_path: Path) -> Supervisor:
    job_dir = tmp_path / "jobs" / "st-1"
    (job_dir / "code").mkdir(parents=True)
    job = {"job_id": "st-1", "nodes": [{"argv": ["python", "-c", "pass"]}], "grace_s": 1.0}
    (job_dir / "job.json").write_text(json.dumps(job))
    return Supervisor(str(job_dir), 0)


def sleeper() -> "subprocess.Popen[bytes]":
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def test_a_stop_that_looks_after_the_step_ended_leaves_what_runs_next_alone(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    assert sup.run_step([sys.executable, "-c", "pass"], dict(PATH="/usr/bin:/bin")) == 0
    after = sleeper()  # what the supervisor runs after the step: the requeue's scontrol, say
    try:
        sup._stop_tree(1.0)  # the stop's thread, its turn coming only now
        assert after.poll() is None, "the stop killed a process started after the step ended"
    finally:
        after.kill()
        after.wait(WAIT_S)


def test_a_stop_while_the_step_runs_ends_its_tree(tmp_path: Path) -> None:
    sup = supervisor(tmp_path)
    sup.child = sleeper()  # the step, running
    stray = sleeper()  # a worker of the step that outlived its parent (re-parented here)
    try:
        sup._stop_tree(1.0)
        assert sup.child.wait(WAIT_S) is not None and stray.wait(WAIT_S) is not None
    finally:
        for proc in (sup.child, stray):
            proc.kill()
            proc.wait(WAIT_S)

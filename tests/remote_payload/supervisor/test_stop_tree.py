"""A stop of the job's tree (cancel, Slurm's time-limit warning) reaches the running child's
processes and nothing started after the child ended: the real ``Supervisor`` on a real job
folder, its ``_stop_tree`` (the body of the thread a signal handler starts) called where such a
thread may get its turn on a loaded machine. A late look at the tree had killed the ``scontrol
requeue`` a warned Slurm job runs after its step, and the job ended failed instead of requeued.

The supervisor's tree is every descendant of its process, so each case runs in a process of
its own (``DRIVER``), never in the test runner, whose descendants are the suite's servers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

WAIT_S = 120.0  # an upper bound for the driver on a loaded machine, never a measured time

DRIVER = """\
import json, subprocess, sys
from remote_payload.supervisor.supervisor import Supervisor

job_dir, case = sys.argv[1], sys.argv[2]
sup = Supervisor(job_dir, 0)
sleep = [sys.executable, "-c", "import time; time.sleep(120)"]
if case == "late":  # the step ended; then the supervisor runs something; then the stop looks
    assert sup.run_step([sys.executable, "-c", "pass"], {"PATH": "/usr/bin:/bin"}) == 0
    after = subprocess.Popen(sleep)
    sup._stop_tree(1.0)
    alive = {"after": after.poll() is None}
    after.kill()
else:  # the step runs, with a worker of it that outlived its parent (re-parented here)
    sup.child = subprocess.Popen(sleep)
    stray = subprocess.Popen(sleep)
    sup._stop_tree(1.0)
    alive = {"child": sup.child.wait(60) is None, "stray": stray.wait(60) is None}
print(json.dumps(alive))
"""


def stop(tmp_path: Path, case: str) -> dict[str, bool]:
    """Run ``case`` of ``DRIVER`` on a fresh job folder: which of its processes the stop left alive."""
    job_dir = tmp_path / case / "jobs" / "st-1"
    (job_dir / "code").mkdir(parents=True)
    job = {"job_id": "st-1", "nodes": [{"argv": ["python", "-c", "pass"]}], "grace_s": 1.0}
    (job_dir / "job.json").write_text(json.dumps(job))
    done = subprocess.run([sys.executable, "-c", DRIVER, str(job_dir), case], cwd=REPO, capture_output=True,
                          text=True, timeout=WAIT_S, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_stop_that_looks_after_the_step_ended_leaves_what_runs_next_alone(tmp_path: Path) -> None:
    assert stop(tmp_path, "late") == {"after": True}, "the stop killed a process started after the step ended"


def test_a_stop_while_the_step_runs_ends_its_tree(tmp_path: Path) -> None:
    assert stop(tmp_path, "running") == {"child": False, "stray": False}

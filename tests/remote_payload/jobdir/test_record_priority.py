"""The environment record (repro/environment.json, pip-freeze.txt) yields the CPU to the job
while the job runs, and goes back to normal priority once the job ended (someone may be waiting
for it). Real threads and processes; the job's python is a stand-in that reports its nice value."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from remote_payload.jobdir.record import RECORD_NICE, Recorder

# Stands for the job's python: whatever it is asked (the probe, pip freeze), it waits for the
# file "go" beside it when there is a file "hold", then says its nice value.
STAND_IN = f"""#!{sys.executable}
import json, os, pathlib, time
here = pathlib.Path(__file__).parent
while (here / "hold").exists() and not (here / "go").exists():
    time.sleep(0.01)
print(json.dumps({{"nice": os.nice(0)}}))
"""


def stand_in(tmp_path: Path) -> Path:
    python = tmp_path / "python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    return python


def niceness(tmp_path: Path) -> tuple[int, int]:
    repro = tmp_path / "job" / "repro"
    return (json.loads((repro / "environment.json").read_text())["nice"],
            json.loads((repro / "pip-freeze.txt").read_text())["nice"])


def test_a_record_made_while_the_job_runs_runs_its_helpers_at_low_priority(tmp_path: Path) -> None:
    before = os.nice(0)
    recorder = Recorder(str(tmp_path / "job"), str(stand_in(tmp_path)), delay_s=0.0)  # the job still runs
    recorder.thread.join()
    assert recorder.error is None
    assert niceness(tmp_path) == (max(RECORD_NICE, before),) * 2
    assert os.nice(0) == before  # only the record's thread was lowered, not the supervisor's others


def test_a_record_made_after_the_job_ended_runs_at_normal_priority(tmp_path: Path) -> None:
    before = os.nice(0)
    recorder = Recorder(str(tmp_path / "job"), str(stand_in(tmp_path)), delay_s=60.0)
    recorder.wait()  # the job ended before the delay: hurry, then join
    assert recorder.error is None and niceness(tmp_path) == (before, before)


def test_the_jobs_end_gives_a_running_record_its_priority_back(tmp_path: Path) -> None:
    """As root (CI, a rented box): the running helper is reniced, and the next one starts at
    normal priority. Another user may not raise a priority again: the record then ends at low
    priority, as the second assertion allows."""
    before = os.nice(0)
    python = stand_in(tmp_path)
    (tmp_path / "hold").write_text("")
    recorder = Recorder(str(tmp_path / "job"), str(python), delay_s=0.0)
    deadline = time.monotonic() + 60
    while not recorder.helpers.pids:  # the probe runs, lowered, and waits
        assert time.monotonic() < deadline, "the record's first helper never started"
        time.sleep(0.01)
    recorder.hurry()  # the job ended
    (tmp_path / "go").write_text("")
    recorder.wait()
    assert recorder.error is None
    expected = before if os.geteuid() == 0 else max(RECORD_NICE, before)
    assert niceness(tmp_path) == (expected, expected)

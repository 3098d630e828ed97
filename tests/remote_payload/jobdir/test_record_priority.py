"""The environment record (repro/environment.json, pip-freeze.txt) runs its helper processes at
low CPU priority, so a job's bookkeeping never competes with the next command on the host."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from remote_payload.jobdir.record import RECORD_NICE, Recorder

# Stands for the job's python: whatever it is asked (the probe, pip freeze), it says its nice value.
SAYS_ITS_NICE = f"#!{sys.executable}\nimport json, os\nprint(json.dumps({{'nice': os.nice(0)}}))\n"


def test_the_record_runs_its_helpers_at_low_priority_and_leaves_the_supervisor_as_it_was(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text(SAYS_ITS_NICE)
    python.chmod(0o755)
    before = os.nice(0)
    recorder = Recorder(str(tmp_path / "job"), str(python), delay_s=0.0)
    recorder.wait()
    assert recorder.error is None
    repro = tmp_path / "job" / "repro"
    probe = json.loads((repro / "environment.json").read_text())
    freeze = json.loads((repro / "pip-freeze.txt").read_text())
    assert probe["nice"] >= max(RECORD_NICE, before) and freeze["nice"] >= max(RECORD_NICE, before)
    assert os.nice(0) == before  # only the record's thread was lowered, not the supervisor's others

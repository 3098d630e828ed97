"""`orch status` across attempts: ELAPSED counts from the first attempt's start
(``first_started``), and a resumed script that began again from an earlier step
(its newest step below ``resumed_from_step``), or one whose ``resume_args`` were left out
(``resume_dropped``), is said to have started over."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from rich.cells import cell_len

from orchestrator.display.progress import JobProgress, row_fields, started_over_note
from tests.support.orch import Orch, write_job


def _ended(status_file: Path, timeout: float = 120) -> dict:
    """status.json once the supervisor wrote its terminal state (read here, not through orch,
    so orch has not recorded the end yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = json.loads(status_file.read_text())
        except (OSError, ValueError):
            status = {}
        if status.get("state") in ("succeeded", "failed", "cancelled"):
            return status
        time.sleep(0.2)
    raise AssertionError(f"{status_file} never ended")


def test_a_second_attempt_counts_elapsed_from_the_first_and_says_it_started_over(orch: Orch) -> None:
    spec = write_job(orch.cwd, "again", "local", ["python", "-c", "raise SystemExit(3)"])
    submitted = orch.json("submit", str(spec))
    job, job_dir = submitted["job_id"], Path(submitted["job_dir"])
    status = _ended(job_dir / "status.json")
    ended = status["ended"]
    # What the supervisor writes for attempt 2 of a job whose script ignored its checkpoint:
    # attempt 1 reached step 980, attempt 2 began at 0 and ended at step 380.
    status.update(attempt=2, started=ended - 100.0, first_started=ended - 1000.0, resumed_from_step=980)
    (job_dir / "status.json").write_text(json.dumps(status))
    rows = [{"step": s, "total_steps": 2000, "loss": 2.0} for s in (900, 980)] + \
        [{"step": s, "total_steps": 2000, "loss": 3.0} for s in (20, 200, 380)]
    (job_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    seen = orch.json("status", job)
    progress = seen["progress"]
    assert seen["state"] == "failed" and progress["state"] == "failed (started over)"
    assert progress["elapsed_s"] == 1000.0  # from the first attempt's start, not this one's 100 s
    assert (progress["step"], progress["started_over_at"], progress["resumed_from_step"]) == (380, 380, 980)
    assert progress["eta_s"] is None

    table = orch("status", job, env={"COLUMNS": "80"}).stdout.splitlines()
    assert all(cell_len(line) <= 80 for line in table), table
    headers, row = table[0].split(), table[1]
    assert "REASON" not in headers and "ELAPSED" in headers, table  # the reason is under the row
    assert "failed (started over)" in row and " 380/2000" in row, table
    assert " 16m40s" in row, table
    assert "note: started over at step 380 (was 980 before the resume)" in table, table
    listed = orch("status", "--wide").stdout.splitlines()[1]
    assert " 16m40s" in listed and "failed (started over)" in listed  # the final row, recorded


def test_row_fields_read_attempts_as_untrusted() -> None:
    base = {"state": "running", "started": 1000.0, "attempt": 2, "first_started": 400.0, "resumed_from_step": 50,
            "metrics": {"step": 10, "total_steps": 100}}
    p = row_fields(base, created=0.0, nodes=1, total=None, price_per_hour=None, now=1100.0)
    assert p.elapsed_s == 700.0 and p.state == "running (started over)" and (p.started_over_at, p.resumed_from_step) == (10, 50)
    assert started_over_note(p) == "started over at step 10 (was 50 before the resume)"
    for odd in ({"first_started": 1500.0}, {"first_started": "400"}, {"first_started": True}):  # later, or not a number
        assert row_fields(dict(base, **odd), 0.0, 1, None, None, now=1100.0).elapsed_s == 100.0
    for same in ({"attempt": 1}, {"attempt": "2"}, {"resumed_from_step": None}, {"resumed_from_step": "50"},
                 {"resumed_from_step": 10}, {"metrics": {}}):  # not a later attempt, not behind, or nothing known
        q = row_fields(dict(base, **same), 0.0, 1, None, None, now=1100.0)
        assert q.started_over_at is None and q.state == "running" and started_over_note(q) is None
    assert row_fields({"state": "succeeded", "started": 5.0, "ended": 65.0}, 0.0, 1, None, None).elapsed_s == 60.0
    done = row_fields({"state": "succeeded", "started": 0.0, "ended": 10.0, "metrics": {"step": 12798}}, 0.0, 1,
                      12800, None)
    assert done.step == 12798 and done.cells()[2] == "12800/12800" and done.cells()[5] == ""  # the total; no ETA
    failed = row_fields({"state": "failed", "started": 0.0, "ended": 10.0, "metrics": {"step": 12798}}, 0.0, 1,
                        12800, None)
    assert failed.cells()[2] == "12798/12800"  # only a success has reached its end


def test_resume_args_left_out_say_started_over_with_no_step_logged() -> None:
    """A later attempt whose `{last_checkpoint}` found nothing (status.json's `resume_dropped`,
    supervisor/attempt.py) started over whether or not a step was logged; the reason is the
    note. Read as untrusted: a first attempt's, a non-string or a blank one says nothing."""
    why = "no complete checkpoint for {last_checkpoint} in the job folder (looked for step_N/): resume_args left out"
    base = {"state": "running", "started": 1000.0, "attempt": 2, "resume_dropped": why}
    p = row_fields(base, created=0.0, nodes=1, total=None, price_per_hour=None, now=1100.0)
    assert p.state == "running (started over)" and p.step is None and p.resume_dropped == why
    assert started_over_note(p) == "started over: " + why
    both = row_fields(dict(base, resumed_from_step=50, metrics={"step": 10}), 0.0, 1, None, None, now=1100.0)
    assert started_over_note(both) == "started over at step 10 (was 50 before the resume); " + why
    assert JobProgress.from_dict(asdict(p)) == p
    for odd in ({"attempt": 1}, {"resume_dropped": 7}, {"resume_dropped": " "}):
        q = row_fields(dict(base, **odd), 0.0, 1, None, None, now=1100.0)
        assert q.state == "running" and q.resume_dropped is None and started_over_note(q) is None
    dirty = row_fields(dict(base, resume_dropped="bad\x1b]0;t\x07\nline"), 0.0, 1, None, None, now=1100.0)
    assert dirty.resume_dropped is not None and "\x1b" not in dirty.resume_dropped and "\n" not in dirty.resume_dropped

"""A followed job's failure is read once: the supervisor's `[orch] job failed: …` line in the
log is not repeated by the laptop's `orch: JOB failed: …` where both land on one output
(a terminal, `2>&1`, `--json`'s stderr), and the exit code stays 1 (submit --follow,
resume --follow); where the log goes elsewhere (`> log.txt`), stderr still says it."""

from __future__ import annotations

import json
import subprocess
import sys

from orchestrator.termtext import EndLines
from tests.support.orch import Orch, write_job

FAILS = """\
import os, pathlib
mark = pathlib.Path(os.environ["ORCH_JOB_DIR"]) / "attempts"
attempt = len(mark.read_text()) + 1 if mark.exists() else 1
mark.write_text("x" * attempt)
raise RuntimeError(f"the loader broke on attempt {attempt}")
"""


def merged(orch: Orch, *args: str) -> subprocess.CompletedProcess[str]:
    """orch with stdout and stderr on one pipe, as a terminal shows them."""
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=orch.cwd, env=orch.env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)


def test_every_follow_prints_a_failure_once_and_exits_non_zero(orch: Orch) -> None:
    spec = write_job(orch.cwd, "fails", "local", ["python", "fail.py"])
    (orch.cwd / "ws" / "fail.py").write_text(FAILS)

    followed = merged(orch, "submit", str(spec), "--follow")
    job = followed.stdout.strip().splitlines()[-1]
    assert followed.returncode == 1, followed.stdout
    assert followed.stdout.count("RuntimeError: the loader broke on attempt 1") == 2, followed.stdout  # traceback
    assert followed.stdout.count("[orch] job failed: ") == 1 and f"orch: {job} failed" not in followed.stdout

    as_json = orch("submit", str(spec), "--follow", "--json", check=1)  # the log on stderr, with the laptop's words
    other = json.loads(as_json.stdout)
    assert "attempt 1" in other["reason"] and as_json.stderr.count("[orch] job failed: ") == 1
    assert f"orch: {other['job_id']} failed" not in as_json.stderr

    for _ in range(2):  # from the host, then from the laptop's copy of the ended log
        logs = merged(orch, "logs", job, "-f")
        assert logs.stdout.count("[orch] job failed: ") == 1 and f"orch: {job} failed" not in logs.stdout, logs.stdout
    apart = orch("logs", job, "-f")  # the log on stdout, the laptop's line on stderr: each says it once
    assert "[orch] job failed: " in apart.stdout and f"orch: {job} failed: rank 0 on node 0: " in apart.stderr

    resumed = merged(orch, "resume", job, "--follow")
    assert resumed.returncode == 1, resumed.stdout
    assert resumed.stdout.count("[orch] job failed: ") == 2  # the whole log: each attempt's end
    assert "the loader broke on attempt 2 (exit code 1)" in resumed.stdout and f"orch: {job} failed" not in resumed.stdout


def test_end_lines_are_whole_lines_of_the_supervisor_matched_with_the_status() -> None:
    ends = EndLines()
    for chunk in ("x\n[orch] job fail", "ed: rank 0 on node 0: boom  (exit code 1)\n[node 1] [orch] job cancelled\n",
                  "[orch] job succeeded"):  # the last line has no newline yet: not counted
        ends.feed(chunk)
    assert ends.said({"state": "failed", "reason": "rank 0 on node 0: boom (exit code 1)"})
    assert ends.said({"state": "cancelled", "reason": None})
    assert not ends.said({"state": "failed", "reason": "rank 0 on node 0: other (exit code 1)"})
    assert not ends.said({"state": "lost", "reason": "rank 0 on node 0: boom (exit code 1)"})
    assert not ends.said({"state": "succeeded"})
    ends.feed("\n")
    assert ends.said({"state": "succeeded"})
    node = EndLines()
    node.feed("[node 1] [orch] job failed: rank 3 on node 1: oom (exit code 1)\r\n")
    assert node.said({"state": "failed", "reason": "node 1: rank 3 on node 1: oom (exit code 1)"})  # aggregate's form
    printed = EndLines()
    printed.feed("print('[orch] job failed: x')\n  [orch] job failed: x\n")
    assert not printed.said({"state": "failed", "reason": "x"})  # only a line that begins with it

"""A user's ``launch.progress`` can never stall orch (docs/reliability.md), through the real CLI
on the `local` host: the laptop refuses a pattern that blows up on a short line; one that only
blows up on a long line is switched off on the server at that line (said in the log and in
status) while the job ends as it should and cancels promptly; and ``orch cancel`` never says
the supervisor was gone while its pid lives."""

from __future__ import annotations

import json
import os
import signal

from remote_payload.jobdir.processes import pid_alive
from tests.support.orch import Orch, write_job
from tests.support.poll import wait_until

# Nothing nested and fast on the laptop's 40-character lines, but O(n**4) on a line of 5000
# digits: it passes orch check and is switched off on the server at that line.
LONG_LINE_BLOWUP = r"(?P<loss>\d+)\d*\d*\d*x"
SCRIPT = """\
import sys, time
print("12x", flush=True)  # a progress row while the pattern is on (loss 12)
print("9" * 5000, flush=True)  # the line that blows its budget
print("step 3: loss 0.5", flush=True)  # the built-in formats go on
print("waiting", flush=True)
for _ in range(int(sys.argv[1])):
    time.sleep(0.1)
"""
SWITCHED_OFF = "launch.progress is switched off for this job: it took more than 1 s of CPU on a line of 5000 characters"


def progress_job(orch: Orch, name: str, progress: str, ticks: int = 0) -> str:
    spec = write_job(orch.cwd, name, "local", ["python", "script.py", str(ticks)],
                     f"  progress: {json.dumps(progress)}\n")
    (orch.cwd / "ws" / "script.py").write_text(SCRIPT)
    return str(spec)


def test_orch_check_refuses_a_pattern_that_blows_up_on_a_short_line_and_warns_of_a_nested_repeat(orch: Orch) -> None:
    spec = progress_job(orch, "catastrophic", r"(?P<step>(x+x+)+)y")
    out = orch("check", spec, check=2)
    assert "Traceback" not in out.stderr
    assert f"{spec}:7:13: " in out.stderr and "launch.progress: the pattern (`(x+x+)+`, a repeat inside a repeat) takes " \
        "more than 1 s of CPU on a line of 40 'x'" in " ".join(out.stderr.split())
    orch("submit", spec, check=2)  # refused before anything connects

    benign = progress_job(orch, "nested", r"it (?P<step>(?:\d+,)*\d+)")
    out = orch("check", benign)
    assert "ok" in out.stdout and "`(?:\\d+,)*` repeats a repeat" in " ".join(out.stderr.split())


def test_a_pattern_that_blows_its_budget_is_switched_off_and_the_job_ends_succeeded(orch: Orch) -> None:
    done = orch("submit", progress_job(orch, "longline", LONG_LINE_BLOWUP), "--follow", "--json", timeout=300)
    result = json.loads(done.stdout)
    assert result["state"] == "succeeded", done.stderr[-3000:]
    job = result["job_id"]
    assert SWITCHED_OFF in result["reason"]
    assert SWITCHED_OFF in " ".join(orch("status", job).stdout.split())
    log = orch("logs", job).stdout
    assert log.count("launch.progress is switched off") == 1 and SWITCHED_OFF in log
    rows = [json.loads(line) for line in (orch.job_dir(job) / "metrics.jsonl").read_text().splitlines()]
    assert [(r.get("step"), r["loss"], r["source"]) for r in rows] == [(None, 12.0, "progress"), (3, 0.5, "log")]


def test_cancel_of_a_job_whose_pattern_spins_is_done_by_its_supervisor(orch: Orch) -> None:
    job = orch.json("submit", progress_job(orch, "spinning", LONG_LINE_BLOWUP, ticks=6000))["job_id"]
    wait_until(lambda: "waiting" in orch("logs", job).stdout, what="the script past its long line", timeout=120)
    supervisor = orch.json("status", job)["supervisor_pid"]
    assert orch("cancel", job, "--grace", "5", timeout=120).stdout.strip().endswith("cancelled")
    status = orch.json("status", job)
    assert (status["state"], status["reason"]) == ("cancelled", "cancelled by SIGTERM")  # the supervisor answered
    wait_until(lambda: not pid_alive(supervisor, "supervisor"), what="the supervisor to end", timeout=60)


def test_cancel_never_says_gone_while_the_supervisor_lives_and_kills_one_deaf_to_sigterm(orch: Orch) -> None:
    """A supervisor that cannot run its SIGTERM handler (stopped here; stuck in C code alike):
    cancel waits the grace, then kills it and the job's processes, and says so."""
    job = orch.json("submit", progress_job(orch, "deaf", r"it (?P<step>\d+)", ticks=6000))["job_id"]
    wait_until(lambda: "waiting" in orch("logs", job).stdout, what="the script to run", timeout=120)
    running = orch.json("status", job)
    supervisor = running["supervisor_pid"]
    os.kill(supervisor, signal.SIGSTOP)
    try:
        assert orch("cancel", job, "--grace", "1", timeout=180).stdout.strip().endswith("cancelled")
        status = orch.json("status", job)
        assert status["state"] == "cancelled" and "gone" not in status["reason"]
        assert status["reason"].startswith(f"cancelled (the supervisor, pid {supervisor}, did not stop within 16 s "
                                           "of SIGTERM: it was killed")
        assert not pid_alive(supervisor, "supervisor")
        assert not [p for p, _ in running["procs"] if pid_alive(p, "script.py")]
    finally:
        if pid_alive(supervisor, "supervisor"):
            os.kill(supervisor, signal.SIGKILL)

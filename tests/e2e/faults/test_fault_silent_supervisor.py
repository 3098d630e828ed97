"""A frozen supervisor never reads as a healthy `running`: SIGSTOP the real supervisor of a
running job and let the job's process end, and `orch status` (table and --json), `orch show`
and `orch hosts check` say it is not answering, for how long, and that its process is
stopped; after SIGCONT it records the job's end and the mark goes. On `local` and on the
loopback sshd. The rules themselves (the bound, a zombie, a claimed field):
tests/remote_payload/jobdir/test_answering.py."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from remote_payload.jobdir import processes
from tests.support.orch import Orch, write_job
from tests.support.poll import wait_until

WAIT_S = 180.0  # an upper bound for a loaded 2-core machine, never a measured time
GATED = """\
import os, pathlib, time
gate = pathlib.Path(os.environ["ORCH_JOB_DIR"]) / "go"
while not gate.exists():
    time.sleep(0.1)
print("the gate opened", flush=True)
"""


def gated_job(orch: Orch, host: str) -> tuple[str, dict[str, Any]]:
    """A running job whose process waits for ``go`` in its folder, with that process seen in its tree."""
    spec = write_job(orch.cwd, "frozen", host, ["python", "gated.py"])
    (orch.cwd / "ws" / "gated.py").write_text(GATED)
    job = orch.json("submit", str(spec))["job_id"]

    def waiting() -> dict[str, Any] | None:
        status = orch.json("status", job)
        assert status["state"] in ("pending", "setting_up", "running"), status
        procs = [p for p, _ in status.get("procs") or [] if os.path.exists(f"/proc/{p}/cmdline")]
        return status if any(b"gated.py" in Path(f"/proc/{p}/cmdline").read_bytes() for p in procs) else None

    return job, wait_until(waiting, what="the job's process running", timeout=WAIT_S, interval=0.3)


def test_a_stopped_supervisor_reads_not_answering_and_stopped_then_recovers(orch: Orch, host: str) -> None:
    job, status = gated_job(orch, host)
    supervisor, procs = int(status["supervisor_pid"]), processes.alive([(int(p), int(t)) for p, t in status["procs"]])
    os.kill(supervisor, signal.SIGSTOP)
    try:
        (orch.job_dir(job) / "go").touch()  # the job's process ends while its supervisor cannot see it
        wait_until(lambda: not processes.alive(procs), what="the job's processes ending", timeout=WAIT_S)
        frozen = wait_until(lambda: (lambda s: s if "not_answering_s" in s else None)(orch.json("status", job)),
                            what="status saying the supervisor does not answer", timeout=WAIT_S, interval=0.5)
        assert frozen["state"] == "running", frozen  # the job's state stays: it may go on
        assert frozen["supervisor_process"] == "T (stopped)" and frozen["not_answering_s"] >= 10, frozen
        assert frozen["reason"].startswith("supervisor not answering for ") and "stopped (SIGSTOP" in frozen["reason"]
        assert f"kill -CONT {supervisor}" in frozen["reason"]
        assert frozen["progress"]["state"] == "running (not answering)"

        table = orch("status", env={"COLUMNS": "80"}).stdout
        assert "running (not answering)" in table and " s: stopped" in table, table
        assert all(len(line) <= 80 for line in table.splitlines()), table
        one = orch("status", job, env={"COLUMNS": "80"}).stdout
        assert "reason: supervisor not answering for" in one and "stopped (SIGSTOP" in one, one

        shown = orch("show", job).stdout
        assert "(running (not answering))" in shown and f"supervisor: pid {supervisor}, T (stopped)" in shown, shown
        assert "supervisor not answering for" in shown

        checked = orch("hosts", "check", host, check=None, env={"COLUMNS": "300"}).stdout
        row = next((line for line in checked.splitlines() if job in line), "")
        assert "running (not answering)" in row and "warn" in row and "stopped (SIGSTOP" in row, checked
    finally:
        os.kill(supervisor, signal.SIGCONT)
    ended = wait_until(lambda: (lambda s: s if s["state"] != "running" else None)(orch.json("status", job)),
                       what="the job's end recorded", timeout=WAIT_S, interval=0.5)
    assert ended["state"] == "succeeded", ended
    assert "not_answering_s" not in ended and not ended.get("reason") and ended["progress"]["state"] == "succeeded"
    assert "not answering" not in orch("show", job).stdout

"""The laptop database's write lock is never left to a stopped process (state/db.py): a Ctrl-Z
that comes in the middle of a write takes effect after the commit, and a lock held past the
wait is a clear error naming the file. Real processes, real job control, a real SQLite file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator.errors import LocalBusy
from orchestrator.state import db as db_file
from orchestrator.state.registry import Registry

from tests.support.poll import wait_until

# A registry write that waits, inside its transaction, for the file "go" — then says "after".
WRITER = textwrap.dedent("""
    import pathlib, sys, time
    from orchestrator.state.registry import Registry
    home = pathlib.Path(sys.argv[1])
    registry = Registry(home)
    from orchestrator.state import db as db_file
    with db_file.writing(registry.path) as db:
        db.execute("UPDATE jobs SET state='running' WHERE job_id='j-1'")
        (home / "in").write_text("1")
        while not (home / "go").exists():
            time.sleep(0.01)
    (home / "after").write_text("1")
""")

# The writer as job control sees it: its own process group, with its parent (this launcher,
# a session leader) in another group of the same session, so a SIGTSTP stops it as a shell's would.
LAUNCHER = textwrap.dedent("""
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], process_group=0)
    print(child.pid, flush=True)
    sys.exit(child.wait())
""")


def state_of(pid: int) -> str:
    """The process's state letter from /proc (T: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


@pytest.fixture
def writer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Start WRITER on a registry holding job j-1; yield (home, pid); end it whatever happened."""
    registry = Registry(tmp_path)
    registry.add("j-1", "j", "j.yaml", ["box"], "/r/jobs/j-1", "pending")
    monkeypatch.setattr(db_file, "BUSY_WAIT_S", 2.0)  # this process's wait, so a held lock fails soon
    root = Path(__file__).resolve().parents[3]
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, WRITER, str(tmp_path)], stdout=subprocess.PIPE,
                                text=True, start_new_session=True, cwd=root,
                                env={**os.environ, "PYTHONPATH": str(root)})
    pid = int(launcher.stdout.readline())
    try:
        wait_until(lambda: (tmp_path / "in").exists(),
                   what="the writer inside its transaction", timeout=60.0, interval=0.02)
        yield tmp_path, pid
    finally:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        launcher.wait(timeout=60)


def test_a_ctrl_z_during_a_write_stops_the_process_only_after_the_commit(writer) -> None:
    home, pid = writer
    os.kill(pid, signal.SIGTSTP)  # Ctrl-Z, in the middle of the transaction
    time.sleep(0.5)
    assert state_of(pid) != "T", "stopped while holding the write lock"
    (home / "go").write_text("1")
    wait_until(lambda: state_of(pid) == "T", what="the held-back stop after the commit", timeout=60.0, interval=0.02)
    assert not (home / "after").exists()  # stopped right at the end of the block, not later

    registry = Registry(home)  # meanwhile every other orch writes at once
    registry.update("j-1", "succeeded")
    assert registry.get("j-1").state == "succeeded"

    os.kill(pid, signal.SIGCONT)  # fg: it goes on from where it stopped
    wait_until(lambda: (home / "after").exists(), what="the writer to go on after SIGCONT", timeout=60.0, interval=0.02)


def test_a_lock_held_past_the_wait_is_a_clear_error_naming_the_file(writer) -> None:
    home, pid = writer
    os.kill(pid, signal.SIGSTOP)  # no process can hold this one back
    with pytest.raises(LocalBusy) as caught:
        Registry(home).update("j-1", "succeeded")
    message = str(caught.value)
    assert str(home / "registry.db") in message and "stayed locked" in message and "kill -CONT" in message
    assert caught.value.exit_code == 2
    os.kill(pid, signal.SIGCONT)
    (home / "go").write_text("1")
    wait_until(lambda: (home / "after").exists(), what="the writer to finish", timeout=60.0, interval=0.02)
    Registry(home).update("j-1", "succeeded")  # the lock is free again
    assert Registry(home).get("j-1").state == "succeeded"

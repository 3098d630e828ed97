"""The one way orch opens the laptop's database, ``ORCH_HOME/registry.db``, and writes to it.

Every table of the file (registry.py's jobs and sweeps, reach, kits, fences) goes through
here, so every orch process on the laptop follows the same rules:

- ``connect(path)``: a connection that waits up to ``BUSY_WAIT_S`` for another orch's write to
  end (WAL: reads never wait for writes).
- ``writing(path)``: one write transaction, the write lock taken at its start (``BEGIN
  IMMEDIATE``: what it reads it may rewrite), committed on a clean exit, rolled back on an
  exception, the connection closed after. While it is open, a Ctrl-Z (SIGTSTP) is held back
  and takes effect right after the commit: a process suspended by job control never keeps the
  file locked for every other orch command on the laptop (they would wait ``BUSY_WAIT_S``,
  then fail). Held back only in the main thread (Python sets signal handlers there alone)
  and only where SIGTSTP has its default action; SIGSTOP cannot be held back by anyone.
- A lock held past the wait raises ``LocalBusy`` (exit 2) naming the file and the likely
  holder, never a bare sqlite error.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from types import FrameType

from orchestrator.errors import LocalBusy

BUSY_WAIT_S = 30.0


def connect(path: Path) -> sqlite3.Connection:
    """A connection to ``path`` that waits ``BUSY_WAIT_S`` for a lock (sqlite3's errors as they are:
    the caller says what an unopenable file means)."""
    conn = sqlite3.connect(path, timeout=BUSY_WAIT_S)
    conn.execute(f"PRAGMA busy_timeout={int(BUSY_WAIT_S * 1000)}")
    return conn


def is_busy(exc: BaseException) -> bool:
    """True for sqlite's "database is locked" / "busy": another process holds the lock."""
    return isinstance(exc, sqlite3.OperationalError) and ("locked" in str(exc) or "busy" in str(exc))


def busy(path: Path) -> LocalBusy:
    """The one message for a lock held past the wait."""
    return LocalBusy(
        f"{path} stayed locked by another orch process for {BUSY_WAIT_S:.0f} s: one stopped in the middle of a "
        "write (suspended with `kill -STOP`, or a debugger) holds it until it goes on. Let it go on (fg, or "
        "kill -CONT PID) or end it (ps aux | grep orchestrator shows it), then run the command again")


@contextmanager
def writing(path: Path) -> Iterator[sqlite3.Connection]:
    """One write transaction on ``path`` (see the module's contract)."""
    with _stop_held():
        try:
            with closing(connect(path)) as conn, conn:
                conn.execute("BEGIN IMMEDIATE")
                yield conn
        except sqlite3.OperationalError as exc:
            if is_busy(exc):
                raise busy(path) from None
            raise


@contextmanager
def _stop_held() -> Iterator[None]:
    """Hold back SIGTSTP while the block runs; a Ctrl-Z that came meanwhile stops the process
    right after it. Nothing is changed outside the main thread or where SIGTSTP is not at its
    default action (ignored, another handler, or an outer block of this one holding it)."""
    if (threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTSTP")
            or signal.getsignal(signal.SIGTSTP) is not signal.SIG_DFL):
        yield
        return
    pending: list[int] = []

    def hold(signum: int, _frame: FrameType | None) -> None:
        pending.append(signum)

    signal.signal(signal.SIGTSTP, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        if pending:
            os.kill(os.getpid(), signal.SIGTSTP)  # the stop asked for, now that nothing is locked

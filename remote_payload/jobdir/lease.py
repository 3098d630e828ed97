"""Locks on the server that cannot outlive their holder (standard library only).

A lease is an ``flock`` on ``<path>`` plus a holder record ``<path>.holder`` (pid, command,
start time) whose mtime is the holder's last sign of progress. The kernel frees the flock
when the holder exits; a holder that is alive but stuck — an agent still reading a stream
from a connection that froze, which the server may not notice for hours — is detected by
its progress: after ``stall_s`` seconds without any, a waiter stops it (SIGKILL, only if its
command line is orch's agent doing the same command) and takes the lease. A waiter never
waits past ``max_wait_s``: it fails naming the holder.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from typing import IO, Any, Dict, Optional

from remote_payload.contract import settings
from remote_payload.contract.jobfolder import atomic_write_json, read_json
from remote_payload.jobdir.processes import pid_alive

PROGRESS_EVERY_S = 1.0


class LeaseBusy(Exception):
    pass


class Lease:
    """A held lease; ``progress()`` is cheap enough to call per block of data."""

    def __init__(self, path: str, handle: IO[str], took_over: Optional[Dict[str, Any]]) -> None:
        self.path, self.handle, self.took_over = path, handle, took_over
        self.last = 0.0
        self.progress()

    def progress(self) -> None:
        now = time.time()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            try:
                os.utime(self.path + ".holder")
            except OSError:
                pass

    def release(self) -> None:
        try:
            os.unlink(self.path + ".holder")
        except OSError:
            pass
        self.handle.close()


def flock_within(handle: IO[Any], wait_s: float, every_s: float) -> bool:
    """Take an exclusive ``flock`` on ``handle``, trying every ``every_s`` for up to ``wait_s``
    seconds; False when it stayed held (the kernel frees it when its holder ends)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(every_s)


def holder(path: str) -> Optional[Dict[str, Any]]:
    """Who holds the lease now — ``{pid, what, started, idle_s}`` — or None when it is free."""
    try:
        with open(path, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return None
            except BlockingIOError:
                pass
    except OSError:
        return None
    return _describe(path)


def _describe(path: str) -> Dict[str, Any]:
    info = read_json(path + ".holder")
    info = info if isinstance(info, dict) else {}
    try:
        idle = time.time() - os.stat(path + ".holder").st_mtime
    except OSError:
        idle = 0.0
    return {"pid": int(info.get("pid") or 0), "what": str(info.get("what") or "?")[:80],
            "started": float(info.get("started") or 0), "idle_s": round(max(idle, 0.0), 1)}


HELPER_MARK = "serve"  # in the command line of orch's helper (the only lease holder): never kill a reused pid


def acquire(path: str, what: str, stall_s: Optional[float] = None, max_wait_s: Optional[float] = None) -> Lease:
    """Take the lease for ``what`` (e.g. ``"receive myproject"``), stopping a stalled holder
    of the same ``what`` (``stall_s``: default ``ORCH_LEASE_STALL_S``, contract/settings.py).
    Raises ``LeaseBusy`` naming the holder after ``max_wait_s``
    (default: twice ``stall_s``). Whatever ends the wait (``LeaseBusy``, an error writing the
    holder record, an interrupt), the lock file is closed: only a returned ``Lease`` holds it,
    and its holder calls ``release`` in a ``finally``."""
    stall_s = settings.lease_stall_s() if stall_s is None else stall_s
    limit = time.time() + (2 * stall_s + 5 if max_wait_s is None else max_wait_s)
    handle = open(path, "a")
    try:
        took_over = _take(handle, path, what, stall_s, limit)
        atomic_write_json(path + ".holder", {"pid": os.getpid(), "what": what, "started": time.time()})
    except BaseException:
        handle.close()
        raise
    return Lease(path, handle, took_over)


def _take(handle: IO[str], path: str, what: str, stall_s: float, limit: float) -> Optional[Dict[str, Any]]:
    """Wait for the flock on ``handle`` (``acquire``); the stalled holder stopped on the way, if any."""
    took_over: Optional[Dict[str, Any]] = None
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return took_over
        except BlockingIOError:
            pass
        current = _describe(path)
        if current["idle_s"] > stall_s and current["what"] == what and current["pid"] > 0 \
                and pid_alive(current["pid"], HELPER_MARK):
            try:
                os.kill(current["pid"], signal.SIGKILL)
                took_over = current
            except OSError:
                pass
        if time.time() > limit:
            held = max(time.time() - current["started"], 0)  # a duration: right whatever the laptop's clock says
            raise LeaseBusy("%s is held by pid %d (%s) for %.0f s, no progress for %.0f s; try again later"
                            % (os.path.basename(path), current["pid"], current["what"], held, current["idle_s"]))
        time.sleep(0.2)

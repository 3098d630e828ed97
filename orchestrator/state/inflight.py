"""In-flight submits: a lease per submission key, held by the submit that works on it.

``ORCH_HOME/submits/<key>.lock`` is ``flock``ed by the submitting process from before it
connects until it returns (launch confirmed, or failed). The kernel drops the lock when that
process ends in any way — Ctrl-C, ``kill -9``, a crash, the laptop's power — so a held lock is
a live submit, never a stale one, and a free one means a reservation left under that key
(``Registry.unconfirmed``) belongs to a submit that is over: an interrupted or failed one. No
pid is ever guessed alive or dead and no clock is compared. Beside the lock,
``<key>.holder`` names the holder (pid, this machine's name, since when) for messages.
``fcntl.flock`` exists on Linux and macOS (the laptop side's platforms).
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterator

from orchestrator.home import orch_home, write_private


@dataclass(frozen=True)
class Holder:
    """Who holds a submission's lease (as its holder file says; 0 / "?" when unreadable)."""

    pid: int
    machine: str
    since: float

    def describe(self) -> str:
        since = time.strftime("%H:%M:%S", time.localtime(self.since)) if self.since > 0 else "?"
        return f"pid {self.pid} on {self.machine}, since {since}"


class Busy(Exception):
    """Another live submit holds the lease; ``holder`` names it."""

    def __init__(self, holder: Holder) -> None:
        super().__init__(holder.describe())
        self.holder = holder


def _paths(key: str) -> tuple[Path, Path]:
    if not key or not all(c in "0123456789abcdef" for c in key):
        raise ValueError(f"not a submission key: {key!r}")
    folder = orch_home() / "submits"
    folder.mkdir(exist_ok=True, mode=0o700)
    return folder / f"{key}.lock", folder / f"{key}.holder"


@contextmanager
def held(key: str) -> Iterator[None]:
    """Hold the lease of submission ``key`` for the ``with`` block; ``Busy`` at once (no wait)
    when a live submit holds it."""
    lock, holder = _paths(key)
    handle: IO[str] = open(lock, "a")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(_read(holder)) from None
        write_private(holder, json.dumps({"pid": os.getpid(), "machine": platform.node(),
                                                    "since": time.time()}))
        yield
    finally:
        handle.close()  # releases the flock (when held)


def holder(key: str) -> Holder | None:
    """The live submit holding ``key``'s lease, or None when no submit of it is running."""
    lock, holder_path = _paths(key)
    try:
        with open(lock, "a") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return None
            except BlockingIOError:
                return _read(holder_path)
    except OSError:
        return None


def _read(path: Path) -> Holder:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return Holder(int(data["pid"]), str(data["machine"])[:80], float(data["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return Holder(0, "?", 0.0)


"""Named periodic duties with one error policy (standard library only, Python >= 3.8).

A ``Duty`` is a piece of work a server process repeats in the background while a job runs —
the supervisor's heartbeat, its manifest of what the job wrote, its metrics from the log —
with a name, an interval and a thread of its own (a slow duty never delays another: a
manifest hashing a large checkpoint does not hold the heartbeat back).

The error policy, the same for every duty:

- an exception in a run is caught and the duty runs again on its next period: a duty is never
  stopped by an error, only by ``stop()``;
- the first failure is told to ``log`` once, with the duty's name and the error; the same
  error again (same type, same errno) is not told again each period while the duty keeps
  failing, an error of another kind is (once);
- the first run that succeeds after failures is told too (``... works again``), so a log that
  says a duty failed also says whether it recovered;
- ``log`` is the owner's voice (the supervisor's ``say``: an ``[orch]`` line in the node's
  log); when it raises, the line goes to stderr instead. Nothing here ever raises out of a run.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Optional, Set, Tuple

Log = Callable[[str], None]


def describe(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, on one line."""
    text = " ".join(str(exc).split())
    return "%s: %s" % (type(exc).__name__, text) if text else type(exc).__name__


def _kind(exc: BaseException) -> Tuple[str, Optional[int]]:
    """What makes two errors "the same" for the policy: the type and, for an OSError, the errno
    (a message may carry a changing path or number)."""
    return type(exc).__name__, getattr(exc, "errno", None)


class Duty:
    """``work`` every ``every_s`` seconds on a thread of its own (named ``orch-<name>``), under
    the module's error policy, until ``stop()``.

    The pause after a run is ``every_s``, or ``pace`` times what the run took when that is
    longer (a duty that reads the whole job folder leaves the disk to the job most of the
    time). ``last``, when given, runs once on the duty's thread after ``stop()`` (under the same
    policy): the final pass of a duty that must see everything (the metrics watcher reads the
    rest of the log). ``start`` and ``stop`` are each called once; ``run_once`` runs one period
    by hand (the policy included) and is what the thread calls."""

    def __init__(self, name: str, every_s: float, work: Callable[[], None], log: Log, pace: float = 0.0,
                 last: Optional[Callable[[], None]] = None) -> None:
        self.name, self.every_s, self.work, self.log, self.pace, self.last = name, every_s, work, log, pace, last
        self.failing: Set[Tuple[str, Optional[int]]] = set()  # the kinds of error told since the last success
        self.failures = 0  # runs failed since the last that succeeded
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="orch-" + name.replace(" ", "-"), daemon=True)

    def start(self) -> "Duty":
        self.thread.start()
        return self

    def stop(self, wait_s: float = 0.0) -> None:
        """No run begins after this (but ``last``); waits at most ``wait_s`` for a run in
        progress and ``last`` to end (0: returns at once)."""
        self.stopping.set()
        if wait_s > 0 and self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(timeout=wait_s)

    def run_once(self, work: Optional[Callable[[], None]] = None) -> float:
        """One run of ``work`` (default: the duty's) under the error policy; the seconds it took.
        Never raises."""
        t0 = time.monotonic()
        try:
            (work or self.work)()
        except Exception as exc:  # noqa: BLE001 - the policy: told once, retried next period
            self._failed(exc)
        else:
            if self.failures:
                self._tell("%s works again (after %d failed run%s)"
                           % (self.name, self.failures, "" if self.failures == 1 else "s"))
            self.failing, self.failures = set(), 0
        return time.monotonic() - t0

    def _failed(self, exc: Exception) -> None:
        self.failures += 1
        if _kind(exc) not in self.failing:
            self.failing.add(_kind(exc))
            self._tell("%s failed: %s; tried again every %g s" % (self.name, describe(exc), self.every_s))

    def _tell(self, line: str) -> None:
        try:
            self.log(line)
        except Exception as exc:  # noqa: BLE001 - the owner's log is gone too: stderr still says it
            try:
                sys.stderr.write("[orch] %s (and the log failed: %s)\n" % (line, describe(exc)))
                sys.stderr.flush()
            except Exception:  # noqa: BLE001 - nowhere left to say it; the duty runs on
                pass

    def _loop(self) -> None:
        pause = self.every_s
        while not self.stopping.wait(pause):
            took = self.run_once()
            pause = max(self.every_s, self.pace * took)
        if self.last is not None:
            self.run_once(self.last)

"""``ORCH_TRACE``: one timestamped line per phase of a command, to see where a slow one waits.

``ORCH_TRACE=1`` writes the lines to stderr; any other value except ``0`` is a file path the
lines are appended to (several commands may share one file: each line names its process).
A line reads::

    orch-trace 12345  +  412.3 ms  send         b1: 3 file(s), 0.0 MB sent; staged 2001

the process id, milliseconds since the command's process started (on Linux, read from
``/proc``: Python's own start and orch's imports count; elsewhere from the first import of this
module), the phase and what it did.
The first line also gives the wall-clock time, so the traces of two commands run one after the
other line up. Off (the default), ``mark`` returns at once: a phase costs one global lookup.

Standard library only, imported by the base of the laptop's layers; it never raises (a file
that cannot be written is left alone).
"""

from __future__ import annotations

import os
import sys
import threading
import time

from orchestrator import settings

_SETTING = settings.TRACE.raw()
ON = _SETTING not in ("", "0")


def process_age_s() -> float:
    """Seconds since this process started (Linux: ``/proc``; elsewhere 0: counted from here)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        return max(time.clock_gettime(time.CLOCK_BOOTTIME) - started, 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


_T0 = time.monotonic() - (process_age_s() if ON else 0.0)
_LOCK = threading.Lock()
PHASE_WIDTH = 12


def restart(t0: float, setting: str) -> None:
    """Count from ``t0`` (``time.monotonic()`` when the command started) and trace as
    ``setting`` (an ``ORCH_TRACE`` value) says: a command the warm server runs counts from its
    client's start and traces as its client's environment asks (orchestrator/warm/)."""
    global _T0, _SETTING, ON
    _T0, _SETTING, ON = t0, setting, setting not in ("", "0")


def since_start_ms() -> float:
    """Milliseconds since this command started (its first trace line)."""
    return (time.monotonic() - _T0) * 1000


def mark(phase: str, detail: str = "") -> None:
    """One line for ``phase`` (a short word or two) with ``detail`` when tracing is on."""
    if not ON:
        return
    line = f"orch-trace {os.getpid()}  +{since_start_ms():8.1f} ms  {phase:<{PHASE_WIDTH}} {detail}".rstrip()
    try:
        with _LOCK:
            if _SETTING == "1":
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
            else:
                with open(os.path.expanduser(_SETTING), "a", encoding="utf-8") as f:
                    f.write(line + "\n")
    except (OSError, ValueError):
        pass


def wall_clock() -> str:
    """The time of day now, to the millisecond (for the first line)."""
    now = time.time()
    return time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"

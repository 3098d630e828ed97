"""Pause points for fault-injection tests (no effect unless ``ORCH_TEST_PAUSE`` is set).

``ORCH_TEST_PAUSE=<point>:<dir>`` makes orch create ``<dir>/<point>.reached`` when it gets
to ``<point>`` and wait (30 s at most) for ``<dir>/<point>.go``, so a test can cut a real
connection at exactly that step.

Out of a job file's reach: the setting is read from this ``orch`` process's own environment
(the test harness starts ``orch`` with it), the only place orch reads it. A job file never
sets the laptop's environment (``secret_env:`` only reads it), and its ``ORCH_`` names are
refused anyway (``remote_payload/contract/envvars.py``: ``reserved``). The server's hooks for
tests have a channel of their own: ``remote_payload/contract/testhooks.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

from orchestrator import settings


def armed(point: str) -> bool:
    """True when the harness set pause point ``point``."""
    name, _, folder = settings.TEST_PAUSE.raw().partition(":")
    return name == point and bool(folder)


def pause(point: str) -> None:
    """Wait at ``point`` for the harness when it armed it (module docstring); else return at once."""
    if not armed(point):
        return
    folder = settings.TEST_PAUSE.raw().partition(":")[2]
    Path(folder, f"{point}.reached").touch()
    deadline = time.time() + 30
    while not Path(folder, f"{point}.go").exists() and time.time() < deadline:
        time.sleep(0.05)

"""Pause points for fault-injection tests (no effect unless ``ORCH_TEST_PAUSE`` is set).

``ORCH_TEST_PAUSE=<point>:<dir>`` makes orch create ``<dir>/<point>.reached`` when it gets
to ``<point>`` and wait (30 s at most) for ``<dir>/<point>.go``, so a test can cut a real
connection at exactly that step.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


def pause(point: str) -> None:
    setting = os.environ.get("ORCH_TEST_PAUSE", "")
    name, _, folder = setting.partition(":")
    if name != point or not folder:
        return
    Path(folder, f"{point}.reached").touch()
    deadline = time.time() + 30
    while not Path(folder, f"{point}.go").exists() and time.time() < deadline:
        time.sleep(0.05)

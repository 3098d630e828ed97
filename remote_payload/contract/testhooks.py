"""Settings for orch's own tests on a server, out of reach of a job file (standard library only).

CI has no GPU, no server an hour off, and tiny models that finish too fast to stop midway, so
a few places in the shipped server code take a setting for tests: the GPU queue's inventory
(``gpus``, ``gpus_busy``, ``gpu_memory_gb``: ``gpuqueue/inventory.py``), the trainer's pause
after each step (``step_delay_s``: ``trainer/loop.py``), the clock of the helper and the
supervisor (``clock_shift_s``: ``jobdir/testclock.py``) and how long a supervisor waits for a
process group's missing ranks before status says so (``join_wait_s``:
``supervisor/joinwatch.py``). Each is read from one place only: the
file ``<root>/test-hooks.json`` (``FILE``), which the test harness writes straight into a
host's orch root before it submits (tests/support/serverhooks.py). Without that file (every
real server) nothing changes.

How a job file is kept from turning a hook on: no field of a job file writes a file, and the
hooks are never read from any environment. A job's ``env:`` and sweep values reach only the
environment of the job's own processes and ``secret_env:`` that of its supervisor; the laptop
refuses ``ORCH_`` names in all three anyway (``envvars.reserved``). What a job's *code* can do
is another matter: it runs as the server's user and could write this file as it could put a
fake ``nvidia-smi`` on that user's PATH; the boundary is the job file, not the user.

The file is untrusted JSON: a value of the wrong type or out of range reads as unset.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Optional

FILE = "test-hooks.json"
MAX_BYTES = 4096
MAX_GPUS = 64


def path(root: str) -> str:
    """Where the harness writes the settings of the host whose orch root is ``root``."""
    return os.path.join(root, FILE)


def settings(root: str) -> Dict[str, Any]:
    """The settings written for ``root`` (``{}`` when there is no file or it is not a JSON
    object). Never raises."""
    try:
        with open(path(root), "rb") as f:
            data = json.loads(f.read(MAX_BYTES + 1)[:MAX_BYTES].decode("utf-8", "replace"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _number(value: Any, low: float, high: float) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if low <= value <= high else None


def fake_gpus(root: str) -> Optional[Dict[str, Any]]:
    """``{"gpus": N, "busy": [indices], "memory_gb": M}`` when the harness gave ``root`` a fake
    GPU inventory (``gpus`` set), else None: nvidia-smi answers."""
    found = settings(root)
    count = _number(found.get("gpus"), 0, MAX_GPUS)
    if count is None:
        return None
    busy = found.get("gpus_busy")
    taken: List[int] = sorted({int(i) for i in busy if _number(i, 0, MAX_GPUS) is not None}) \
        if isinstance(busy, list) else []
    memory = _number(found.get("gpu_memory_gb"), 1, 1 << 20)
    return {"gpus": int(count), "busy": taken, "memory_gb": int(memory) if memory else 80}


def step_delay_s(root: str) -> float:
    """Seconds the built-in trainer sleeps after each step on ``root``'s host (0: none)."""
    return _number(settings(root).get("step_delay_s"), 0, 3600) or 0.0


def clock_shift_s(root: str) -> float:
    """Seconds ``root``'s helper and supervisors move their clock by (0: none)."""
    return _number(settings(root).get("clock_shift_s"), -10 * 365 * 86400, 10 * 365 * 86400) or 0.0


def join_wait_s(root: str) -> float:
    """Seconds without the rest of a process group before ``root``'s supervisors say ranks are
    awaited (``supervisor/joinwatch.py``; 0: its own wait)."""
    return _number(settings(root).get("join_wait_s"), 0, 86400) or 0.0

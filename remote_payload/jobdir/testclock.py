"""A server whose clock is off, for tests only (standard library only).

``ORCH_TEST_CLOCK_SHIFT_S=N`` in the server's environment makes ``shift_for_tests`` move this
process's ``time.time`` by N seconds (negative: behind), as on a server whose clock is N
seconds ahead of the laptop's. The helper (``helper/serve.py``) and the supervisor call it
first thing; the job's processes inherit the variable (a test's job script reads it to write
its own times). Without the variable nothing changes.
"""

from __future__ import annotations

import os
import time


def shift_for_tests() -> None:
    try:
        shift = float(os.environ.get("ORCH_TEST_CLOCK_SHIFT_S") or 0)
    except ValueError:
        return
    if shift:
        real = time.time
        time.time = lambda: real() + shift

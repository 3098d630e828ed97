"""A server whose clock is off, for tests only (standard library only).

``clock_shift_s`` in the orch root's ``test-hooks.json`` (written there by the test harness,
never by a job file and never read from any environment: ``contract/testhooks.py``) makes
``shift_for_tests`` move this process's ``time.time`` by that many seconds (negative: behind),
as on a server whose clock is that far ahead of the laptop's. The helper (``helper/serve.py``)
and the supervisor call it first thing. Without the file nothing changes.
"""

from __future__ import annotations

import time

from remote_payload.contract import testhooks


def shift_for_tests(root: str) -> None:
    """Shift this process's clock by the harness's ``clock_shift_s`` for ``root`` (if any)."""
    shift = testhooks.clock_shift_s(root)
    if shift:
        real = time.time
        time.time = lambda: real() + shift

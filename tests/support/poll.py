"""The one way a test waits for something to happen: poll a predicate until it holds.

A timeout here bounds a hung test; it is never a timing assertion (a test that passes only
because something was fast enough asserts nothing about orch)."""

from __future__ import annotations

import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], Optional[T]], *, what: str, timeout: float, interval: float = 0.1,
               detail: Callable[[], str] | None = None) -> T:
    """``predicate()``'s first truthy value, asked every ``interval`` seconds (first at once).

    Raises AssertionError naming ``what``, the timeout and the last value ``predicate`` returned
    once ``timeout`` seconds have passed without a truthy one; ``detail()`` (a daemon's log, say)
    is appended to that message. An exception ``predicate`` raises is never caught: a probe that
    knows the wait is hopeless (the process it waits on exited) ends it at once."""
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            message = f"gave up waiting {timeout:g} s for {what} (last seen: {last!r})"
            raise AssertionError(f"{message}\n{detail()}" if detail is not None else message)
        time.sleep(interval)

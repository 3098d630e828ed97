"""Acting on a moved job's fences (``orchestrator/state/fences.py``) at the first contact with
the host it left.

``Remote`` calls ``settle_on`` before the first request of each command on a host: every
pending fence of that host gets the ``fence`` request (the server stops the superseded
attempt's whole process tree as ``orch cancel`` does, waits for it, and sets its folder aside
as ``jobs/.superseded/<id>-<time>/``), the fence is recorded settled with what was found, and
one line says so on stderr. So whichever orch command first reaches the old host — a status,
a submit, a fetch, a move back — ends the old attempt before it does anything else there.

A lost link raises (``HostError``: the command's own requests would fail the same way); a
fence the server could not carry out is said as a warning and stays pending for the next
contact. Never raises for a host without fences, and reads the registry only (no host is
contacted for this alone).
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Protocol

from orchestrator.errors import RemoteError
from orchestrator.home import orch_home
from orchestrator.hosts.inventory import Host
from orchestrator.state import fences, reach
from orchestrator.termtext import clean
from remote_payload.contract.protocol import GRACE_S


class Remote(Protocol):
    """What fencing needs of ``helper.remote.Remote`` (which calls ``settle_on``)."""

    host: Host

    def call(self, op: str, *, timeout: float | None = 300, **args: Any) -> dict[str, Any]: ...

FENCE_TIMEOUT_S = GRACE_S + 300  # the job's grace, its supervisor's last records, the jobs lock
_HOSTS: dict[str, threading.Lock] = {}  # one fencing at a time per host in this process
_GUARD = threading.Lock()


def tell(line: str) -> None:
    """The one line that says what a fence did (stderr, cleaned: it holds server text)."""
    sys.stderr.write(clean(line) + "\n")
    sys.stderr.flush()


def outcome(fence: fences.Fence, reply: dict[str, Any]) -> str:
    """What the ``fence`` request found and did, for the user and the registry."""
    when = reach.clock(fence.moved_at)
    kept = clean(str(reply.get("kept") or ""))[:300]
    was = clean(str(reply.get("state") or "unknown"))[:40]
    if not reply.get("found"):
        return f"{fence.job_id}: nothing of its attempt on {fence.host} is left (it moved to {fence.moved_to} at {when})"
    if reply.get("stopped"):
        return (f"{fence.job_id}: stopped its superseded attempt on {fence.host} (it was {was}; the job moved to "
                f"{fence.moved_to} at {when}); that folder is set aside as {kept} and never read as the job's")
    return (f"{fence.job_id}: its earlier folder on {fence.host} ({was}) is set aside as {kept}: the job lives on "
            f"{fence.moved_to} since {when}")


def settle_on(remote: Remote, say: Callable[[str], None] = tell) -> list[fences.Fence]:
    """Act on every pending fence of ``remote``'s host (see the module contract); returns the
    fences this call settled."""
    db = orch_home() / "registry.db"
    if not fences.pending(db, host=remote.host.name):
        return []
    with _GUARD:
        lock = _HOSTS.setdefault(remote.host.name, threading.Lock())
    done = []
    with lock:
        for fence in fences.pending(db, host=remote.host.name):
            try:
                reply = remote.call("fence", job=fence.job_id, moved_to=fence.moved_to, timeout=FENCE_TIMEOUT_S)
            except RemoteError as exc:
                say(f"warning: {fence.job_id}'s superseded attempt on {fence.host} could not be stopped: "
                    f"{str(exc).splitlines()[0]}; orch tries again at its next contact with {fence.host}")
                continue
            line = outcome(fence, reply)
            if fences.settle(db, fence, line):
                done.append(fence)
                say(line)
    return done

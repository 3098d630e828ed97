"""The server's clock against the laptop's, and server timestamps moved onto the laptop's.

A server's clock may be off by minutes or hours (a container without NTP, a wrong timezone
setting written as UTC). Every reply of the helper carries ``clock``, the server's
``time.time()`` as it answered (``remote_payload/helper/serve.py``). ``Offset`` estimates the
server's clock minus the laptop's from the replies of a connection (the one with the shortest
round trip wins: its error is at most half of that), and ``to_laptop`` moves every server
timestamp of a reply by it, where replies arrive (``Remote``). So everything the laptop
computes from them against its own clock — ELAPSED, ETA, COST, SINCE, the times it prints —
is right whatever the server's clock says; a server that sends no ``clock`` (an older orch)
is taken as agreeing with the laptop.
"""

from __future__ import annotations

import math
from typing import Any

STATUS_TIMES = ("heartbeat", "started", "ended", "first_started")  # protocol.JOB_STATUS's server times
MIN_SKEW_S = 5.0  # clocks closer than this are taken as agreeing (the measure itself jitters by the round trip)


class Offset:
    """The server's clock minus the laptop's, in seconds (``seconds``); 0.0 until a reply
    carried ``clock``. ``correction`` is what timestamps are moved by: 0 under ``MIN_SKEW_S``,
    else the whole seconds — so a timestamp reads the same in every command (the caches keyed
    by a job's ``ended`` stay valid) and NTP-synced hosts are never touched."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.round_trip: float | None = None

    def measure(self, sent: float, arrived: float, reply: Any) -> None:
        """Learn from a reply sent at ``sent`` and arrived at ``arrived`` (laptop times); a
        ``clock`` that is missing or not a finite number teaches nothing."""
        clock = reply.get("clock") if isinstance(reply, dict) else None
        if isinstance(clock, bool) or not isinstance(clock, (int, float)) or not math.isfinite(clock):
            return
        trip = max(arrived - sent, 0.0)
        if self.round_trip is None or trip <= self.round_trip:
            self.round_trip, self.seconds = trip, float(clock) - (sent + arrived) / 2

    @property
    def correction(self) -> float:
        return 0.0 if abs(self.seconds) < MIN_SKEW_S else float(round(self.seconds))


def _move(record: Any, keys: tuple[str, ...], by: float) -> None:
    if not isinstance(record, dict):
        return
    for key in keys:
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            record[key] = value - by


def status_to_laptop(status: Any, by: float) -> Any:
    """A job status with its server times (and its metrics' ``time``) on the laptop's clock."""
    if by and isinstance(status, dict):
        _move(status, STATUS_TIMES, by)
        _move(status.get("metrics"), ("time",), by)
    return status


def to_laptop(op: str, reply: dict[str, Any], by: float) -> dict[str, Any]:
    """``reply`` to ``op`` (already checked against its row) with its server timestamps moved
    by ``by`` seconds onto the laptop's clock (in place; returned)."""
    if not by:
        return reply
    if op == "status":
        for status in reply["jobs"].values():
            status_to_laptop(status, by)
    elif op == "cancel":
        status_to_laptop(reply, by)
    elif op in ("launch", "adopt", "show"):
        status_to_laptop(reply.get("status"), by)
        moves = reply.get("moves") if op == "show" else None
        for move in moves if isinstance(moves, list) else []:
            _move(move, ("at",), by)
    elif op == "queue":
        _move(reply, ("seen",), by)
        for job in reply["jobs"]:
            _move(job, ("since", "granted"), by)
    elif op == "hello":
        sync = reply.get("sync")
        _move(sync.get("lock") if isinstance(sync, dict) else None, ("started",), by)
    elif op == "gc":
        for item in reply["items"]:
            if isinstance(item, dict):
                _move(item, ("at",), by)
                status_to_laptop(item.get("status"), by)
    elif op == "preflight":
        for space in reply.get("workspaces") or []:
            _move(space, ("synced",), by)
    return reply

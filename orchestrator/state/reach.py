"""Whether each host answers, as this laptop last saw it — so ``orch status`` can say that a
job's server is gone instead of showing a stale row forever.

Per host: when it last answered (``last_ok``), and since when it has not (``failing_since``:
the first failed contact after the last success; ``last_failure``: the latest). Kept in the
table ``reach`` of ``ORCH_HOME/registry.db`` (created here, ``CREATE TABLE IF NOT EXISTS``;
the jobs table is registry.py's). Each record is one short transaction on the WAL database
with a busy timeout, so any number of orch processes may record at once; the last writer
wins, and a success always clears the failure.

A host is *lost* when its failed contacts span at least ``ORCH_LOST_AFTER_S`` seconds
(default 600): the first failure and the latest are that far apart. Only contacts count —
a laptop that slept or was closed adds no failure — so a host is never called lost without
failing right now. ``jobs.refresh`` records every contact and shows a lost host's unfinished
jobs as ``lost`` with ``lost_reason``; the registry keeps their real record, so they show
their true state again as soon as the host answers.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from orchestrator import settings
from orchestrator.state import db as db_file

LOST_AFTER_S = 600.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS reach (
    host TEXT PRIMARY KEY,
    last_ok REAL,
    failing_since REAL,
    last_failure REAL,
    error TEXT NOT NULL DEFAULT ''
)
"""
_OK = ("INSERT INTO reach (host, last_ok, failing_since, last_failure, error) VALUES (?, ?, NULL, NULL, '') "
       "ON CONFLICT(host) DO UPDATE SET last_ok=excluded.last_ok, failing_since=NULL, last_failure=NULL, error=''")
_FAILED = ("INSERT INTO reach (host, last_ok, failing_since, last_failure, error) VALUES (?, NULL, ?, ?, ?) "
           "ON CONFLICT(host) DO UPDATE SET failing_since=COALESCE(reach.failing_since, excluded.failing_since), "
           "last_failure=excluded.last_failure, error=excluded.error")


@dataclass(frozen=True)
class Reach:
    """One host's record; times are ``time.time()`` values, None when never seen."""

    host: str
    last_ok: float | None = None
    failing_since: float | None = None
    last_failure: float | None = None
    error: str = ""


def lost_after_s() -> float:
    """``ORCH_LOST_AFTER_S`` (seconds, at least 0; default 600; ``SettingError`` when unreadable)."""
    return settings.LOST_AFTER.seconds()


def record(db: Path, host: str, ok: bool, error: str = "", now: float | None = None) -> Reach:
    """Record one contact with ``host`` (``ok``: it answered; else ``error``, one line) in the
    database file ``db`` and return the host's record as it now stands."""
    now = time.time() if now is None else now
    with db_file.writing(db) as conn:
        conn.execute(SCHEMA)
        if ok:
            conn.execute(_OK, (host, now))
        else:
            conn.execute(_FAILED, (host, now, now, error[:500]))
        row = conn.execute("SELECT host, last_ok, failing_since, last_failure, error FROM reach WHERE host=?",
                           (host,)).fetchone()
    return Reach(*row)


def get(db: Path, host: str) -> Reach:
    """``host``'s record (an empty one when it was never contacted or the table is absent)."""
    try:
        with closing(db_file.connect(db)) as conn:
            row = conn.execute("SELECT host, last_ok, failing_since, last_failure, error FROM reach WHERE host=?",
                               (host,)).fetchone()
    except sqlite3.OperationalError:
        return Reach(host)
    return Reach(*row) if row else Reach(host)


def is_lost(reach: Reach) -> bool:
    """True when ``reach``'s failed contacts span at least ``ORCH_LOST_AFTER_S`` seconds."""
    if reach.failing_since is None or reach.last_failure is None:
        return False
    return reach.last_failure - reach.failing_since >= lost_after_s()


def span(seconds: float) -> str:
    """``40 s``, ``12 min``, ``3 h 05 min``, ``2 d 4 h``."""
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def clock(when: float, now: float | None = None) -> str:
    """Local time of ``when``: ``10:31`` today, ``Nov 29 10:31`` another day."""
    now = time.time() if now is None else now
    day = time.localtime(when)
    fmt = "%H:%M" if day[:3] == time.localtime(now)[:3] else "%b %d %H:%M"
    return time.strftime(fmt, day)


def unreachable(reach: Reach, now: float | None = None) -> str:
    """``host box unreachable for 12 min (since 10:31)``."""
    now = time.time() if now is None else now
    since = reach.failing_since if reach.failing_since is not None else now
    return f"host {reach.host} unreachable for {span(now - since)} (since {clock(since, now)})"


def lost_reason(reach: Reach, job_id: str, now: float | None = None) -> str:
    """The reason a lost host's unfinished job shows: how long, since when, and the way out."""
    return f"{unreachable(reach, now)}; if the instance is gone: orch resume {job_id} --on OTHER_HOST"

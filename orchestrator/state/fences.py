"""Fences: a moved job's earlier attempts, superseded, as this laptop remembers them.

When ``orch resume JOB --on NEW`` moves a job, each host it left gets a fence in the table
``fences`` of ``ORCH_HOME/registry.db`` (written in the same transaction as the job's new
place, ``Registry.move``): the job, the host, the folder the attempt ran in, where the job
went and when. A fence is *pending* until orch has acted on it on that host — stopped the
old attempt's process tree and set its folder aside (the ``fence`` request) — and *settled*
after, with what was found. A pending fence is acted on at the first contact with its host
(``orchestrator/helper/fence.py``, called by every helper session), so an old attempt on a
host that was cut off when the job moved never runs on unnoticed once orch reaches it again.

One row per (job, host): a later move away from the same host replaces it. Each change is
one short transaction on the WAL database (busy timeout), like ``reach``.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from orchestrator.state import db as db_file

SCHEMA = """
CREATE TABLE IF NOT EXISTS fences (
    job_id TEXT NOT NULL,
    host TEXT NOT NULL,
    job_dir TEXT NOT NULL,
    moved_to TEXT NOT NULL,
    moved_at REAL NOT NULL,
    settled REAL,
    outcome TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (job_id, host)
)
"""
_COLUMNS = "job_id, host, job_dir, moved_to, moved_at, settled, outcome"


@dataclass(frozen=True)
class Fence:
    """One superseded attempt: ``job_id``'s on ``host`` (in ``job_dir``), superseded when the
    job moved to ``moved_to`` at ``moved_at``; ``settled`` (a time) once orch acted on it there,
    with ``outcome`` (one line: what it found and did)."""

    job_id: str
    host: str
    job_dir: str
    moved_to: str
    moved_at: float
    settled: float | None = None
    outcome: str = ""


def add(conn: sqlite3.Connection, job_id: str, hosts: list[tuple[str, str]], moved_to: list[str]) -> None:
    """In the caller's transaction: fence ``job_id``'s attempts on ``hosts`` ((host, job folder)
    pairs) — it now lives on ``moved_to``, where any fence it had is dropped (it lives there again)."""
    conn.execute(SCHEMA)
    now = time.time()
    for host in moved_to:
        conn.execute("DELETE FROM fences WHERE job_id=? AND host=?", (job_id, host))
    for host, job_dir in hosts:
        conn.execute(f"INSERT OR REPLACE INTO fences ({_COLUMNS}) VALUES (?,?,?,?,?,NULL,'')",
                     (job_id, host, job_dir, ", ".join(moved_to), now))


def pending(db: Path, *, host: str | None = None, job_ids: list[str] | None = None) -> list[Fence]:
    """The fences not yet acted on: on ``host``, or of ``job_ids``, or all. Empty when the
    registry or the table is not there yet (never creates either)."""
    if not db.is_file():
        return []
    where, args = ["settled IS NULL"], []
    if host is not None:
        where.append("host=?")
        args.append(host)
    if job_ids is not None:
        if not job_ids:
            return []
        where.append(f"job_id IN ({','.join('?' * len(job_ids))})")
        args.extend(job_ids)
    try:
        with closing(db_file.connect(db)) as conn:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM fences WHERE {' AND '.join(where)} ORDER BY moved_at",
                                args).fetchall()
    except sqlite3.DatabaseError:  # no table yet (nothing ever moved), or a damaged file: nothing known
        return []
    return [Fence(*row) for row in rows]


def settle(db: Path, fence: Fence, outcome: str) -> bool:
    """Record that ``fence`` was acted on. True when this call settled it (False: another
    orch did first, or a later move replaced it)."""
    with db_file.writing(db) as conn:
        cur = conn.execute("UPDATE fences SET settled=?, outcome=? WHERE job_id=? AND host=? AND moved_at=? "
                           "AND settled IS NULL", (time.time(), outcome[:500], fence.job_id, fence.host,
                                                   fence.moved_at))
        return cur.rowcount == 1


def of_job(db: Path, job_id: str) -> list[Fence]:
    """Every fence of ``job_id``, pending or settled (``orch show``)."""
    if not db.is_file():
        return []
    try:
        with closing(db_file.connect(db)) as conn:
            rows = conn.execute(f"SELECT {_COLUMNS} FROM fences WHERE job_id=? ORDER BY moved_at", (job_id,)).fetchall()
    except sqlite3.DatabaseError:
        return []
    return [Fence(*row) for row in rows]

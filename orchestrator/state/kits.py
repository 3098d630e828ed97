"""Where each job's laptop copy (the move kit ``<run folder>/.orch-job/``) was written.

``orch fetch JOB --watch`` keeps a job's kit under whichever folder it was run from (or
``--dest``); ``orch resume JOB --on HOST`` may run anywhere else. So the watch records the
kit's run folder (absolute) here each time it writes the kit's ``move.json``, and the move
finds it from any directory. Table ``kits`` of ``ORCH_HOME/registry.db``, one row per job, one
short transaction per write (WAL, busy timeout), like ``reach``.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from pathlib import Path

from orchestrator.state import db as db_file

SCHEMA = """
CREATE TABLE IF NOT EXISTS kits (
    job_id TEXT PRIMARY KEY,
    run_dir TEXT NOT NULL,
    updated REAL NOT NULL
)
"""


def record(db: Path, job_id: str, run_dir: Path) -> None:
    """``job_id``'s kit now lives under ``run_dir`` (kept absolute)."""
    with db_file.writing(db) as conn:
        conn.execute(SCHEMA)
        conn.execute("INSERT OR REPLACE INTO kits (job_id, run_dir, updated) VALUES (?,?,?)",
                     (job_id, str(run_dir.resolve()), time.time()))


def recorded(db: Path, job_id: str) -> Path | None:
    """The run folder the latest kit of ``job_id`` was written in, if one was recorded."""
    if not db.is_file():
        return None
    try:
        with closing(db_file.connect(db)) as conn:
            row = conn.execute("SELECT run_dir FROM kits WHERE job_id=?", (job_id,)).fetchone()
    except sqlite3.DatabaseError:
        return None
    return Path(row[0]) if row else None

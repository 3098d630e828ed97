"""The layout of ``ORCH_HOME/registry.db`` across orch versions: its version, its migrations,
and the rules that let an older and a newer orch share one file.

The file says what it is in its table ``meta`` (key, value):

- ``layout``: the layout version of its tables (an int) — the newest that an orch which opened
  it knew and migrated it to. A file without ``meta`` is layout 0: what every orch before
  layouts wrote (its tables are those of layout 1, or fewer: the oldest lack ``sweep_jobs``).
- ``compatible``: the oldest layout an orch may know and still use the file. An orch whose
  ``LAYOUT`` is below it refuses the file up front (``too_new``: exit 2 naming the file, the
  orch version that wrote it and the way out) — before it connects anywhere.
- ``written_by``: the orch version that last raised ``layout``.

What every orch version holds to, so that a newer file stays usable by an older orch:

- Every read and every write names its columns (no ``INSERT ... VALUES`` by position, no
  ``SELECT *``): a column this orch does not know is left to its default on insert and never
  read.
- A later layout may add tables, and columns that have a default (or may be NULL), and keep
  ``compatible`` as it was. A change an older orch cannot live with — a column renamed or
  dropped, one ``NOT NULL`` without a default, a value whose meaning changed — raises
  ``compatible`` to the new layout. A column ``NOT NULL`` without a default that this orch does
  not know is refused like a raised ``compatible`` (``check_columns``), whatever ``meta`` says.
- Opening migrates an older file forward (``MIGRATIONS``, one step per layout, in one write
  transaction) and never lowers ``layout`` or ``compatible``.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from orchestrator import __version__
from orchestrator.errors import LocalFileError
from orchestrator.state import fences, kits, reach

LAYOUT = 1  # the layout this orch writes and knows
COMPATIBLE = 1  # the oldest layout whose orch may use a file of layout LAYOUT (see the module's rules)
UPGRADE = "pip install -U orch-gpu"

JOBS = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    spec_path TEXT NOT NULL,
    hosts TEXT NOT NULL,
    job_dir TEXT NOT NULL,
    created REAL NOT NULL,
    state TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '{}',
    updated REAL NOT NULL
)
"""
SWEEP_JOBS = """
CREATE TABLE IF NOT EXISTS sweep_jobs (
    job_id TEXT PRIMARY KEY,
    sweep TEXT NOT NULL,
    combination INTEGER NOT NULL,
    combinations INTEGER NOT NULL,
    vals TEXT NOT NULL,
    summary TEXT NOT NULL DEFAULT '{}'
)
"""
META = "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
TABLES = ("jobs", "sweep_jobs", "reach", "kits", "fences")  # what this orch reads and writes


@dataclass(frozen=True)
class Found:
    """What a file says of itself (layout 0, compatible 0, written_by "": no ``meta``)."""

    layout: int
    compatible: int
    written_by: str


def _to_1(db: sqlite3.Connection) -> None:
    """Layout 1: every table orch keeps, and ``meta``. Layout 0 files hold the same tables or
    fewer (before sweeps: ``jobs`` alone; ``reach``, ``kits``, ``fences`` were made on first use)."""
    for ddl in (JOBS, SWEEP_JOBS, reach.SCHEMA, kits.SCHEMA, fences.SCHEMA, META):
        db.execute(ddl)
    db.execute("CREATE INDEX IF NOT EXISTS sweep_jobs_by_sweep ON sweep_jobs (sweep, combination)")


# MIGRATIONS[n] takes a file of layout n - 1 to layout n, inside the caller's write transaction.
MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _to_1}


def found(db: sqlite3.Connection) -> Found:
    """What ``db``'s ``meta`` says (``ValueError`` when its values are not what a layout writes)."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone() is None:
        return Found(0, 0, "")
    values = dict(db.execute("SELECT key, value FROM meta").fetchall())
    try:
        layout, compatible = int(values["layout"]), int(values.get("compatible", 0))
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"its meta table holds no layout version ({values.get('layout')!r})") from None
    return Found(layout, compatible, str(values.get("written_by", "?"))[:40])


def prepare(db: sqlite3.Connection, path: Path) -> Found:
    """Make ``db`` (the file ``path``) usable by this orch, or refuse it: a file whose
    ``compatible`` is above ``LAYOUT``, or with a column this orch cannot write, raises
    ``too_new`` and is left as it was; a ``jobs`` table that is not orch's raises ``ValueError``
    (the caller's "damaged"); an older layout is migrated forward in one write
    transaction (another orch migrating at once: the second finds the work done). Returns what
    the file now says."""
    seen = found(db)
    if seen.compatible > LAYOUT:
        raise too_new(path, seen)
    jobs = {row[1] for row in db.execute("PRAGMA table_info(jobs)").fetchall()}
    if jobs and not KNOWN["jobs"] <= jobs:  # never migrate another program's database
        raise ValueError(f"its jobs table lacks {', '.join(sorted(KNOWN['jobs'] - jobs))}: not orch's registry")
    if seen.layout < LAYOUT:
        db.execute("BEGIN IMMEDIATE")
        try:
            seen = found(db)
            if seen.compatible > LAYOUT:
                raise too_new(path, seen)
            for step in range(seen.layout + 1, LAYOUT + 1):
                MIGRATIONS[step](db)
            if seen.layout < LAYOUT:
                db.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                               [("layout", str(LAYOUT)), ("compatible", str(max(COMPATIBLE, seen.compatible))),
                                ("written_by", __version__)])
                seen = Found(LAYOUT, max(COMPATIBLE, seen.compatible), __version__)
            db.commit()
        except BaseException:
            db.rollback()
            raise
    check_columns(db, path, seen)
    return seen


def check_columns(db: sqlite3.Connection, path: Path, seen: Found) -> None:
    """Refuse (``too_new``) a table of ``TABLES`` with a column this orch does not know that
    is ``NOT NULL`` without a default: every insert of this orch would fail on it."""
    for table in TABLES:
        for _, name, _, notnull, default, primary in db.execute(f"PRAGMA table_info({table})").fetchall():
            if notnull and default is None and not primary and name not in KNOWN[table]:
                raise too_new(path, seen, f"its table {table} has a column {name!r} that must be filled in, "
                                          "which this orch does not know")


KNOWN = {
    "jobs": {"job_id", "name", "spec_path", "hosts", "job_dir", "created", "state", "detail", "updated"},
    "sweep_jobs": {"job_id", "sweep", "combination", "combinations", "vals", "summary"},
    "reach": {"host", "last_ok", "failing_since", "last_failure", "error"},
    "kits": {"job_id", "run_dir", "updated"},
    "fences": {"job_id", "host", "job_dir", "moved_to", "moved_at", "settled", "outcome"},
}


def too_new(path: Path, seen: Found, why: str = "") -> LocalFileError:
    """The one message for a registry this orch must not use: the file, who wrote it, and the
    way out (upgrade orch; or another ``ORCH_HOME`` for this one). The file is left as it is."""
    writer = f"orch {seen.written_by}" if seen.written_by else "another orch version"
    layout = (f"registry layout {seen.layout}, for an orch that knows layout {seen.compatible} or later"
              if seen.layout else "registry layout 0")
    return LocalFileError(
        f"{path} was written by {writer} ({layout}{'; ' + why if why else ''}); this orch {__version__} knows "
        f"layouts up to {LAYOUT}, so it leaves the file as it is: upgrade orch ({UPGRADE}) and run the command "
        "again, or give this orch a registry of its own (ORCH_HOME=<another folder>)")

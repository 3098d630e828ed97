"""The local job registry: SQLite under ``ORCH_HOME`` (WAL, busy timeout).

Safe with several ``orch`` processes at once: every write is one short transaction.
It caches what the hosts say; the hosts' ``status.json`` files stay the truth — until a job is
terminal (``TERMINAL``): a job never leaves those states by itself, so the record is then the
job's final word and ``orch status`` renders it without asking the host. Beside the status
(``detail``) a terminal job keeps its final status row (``final``: what ``orch status`` showed
when it first saw the job terminal, with the step total and cost that needed the spec and the
inventory); it is kept while the job stays in that state and dropped when the state changes.
Light on purpose: sqlite3 and the standard library only, so ``orch status`` of finished jobs
starts fast.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from orchestrator.errors import LocalFileError, UsageError
from orchestrator.home import orch_home
from remote_payload import protocol

TERMINAL = protocol.TERMINAL  # a job never leaves these states by itself
SUBMITTING = "submitting"  # reserved by a submit that has not yet seen its launch confirmed
LISTED = 8  # ids an ambiguous prefix's error names before "and N more"
_ID_TAIL = re.compile(r"-\d{8}-\d{6}-[0-9a-f]{4}$")  # plan.make_job_id: <name>-<yyyymmdd-hhmmss>-<4 hex>

SCHEMA = """
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
COLUMNS = {"job_id", "name", "spec_path", "hosts", "job_dir", "created", "state", "detail", "updated"}
# The final status row lives inside ``detail`` under this key (no new column: an older orch
# sharing this ORCH_HOME keeps working); ``JobRecord.detail`` never shows it.
FINAL_KEY = "_orch_final_row"


@dataclass(frozen=True)
class JobRecord:
    job_id: str
    name: str
    spec_path: str
    hosts: list[str]
    job_dir: str
    created: float
    state: str
    detail: dict[str, Any]
    final: dict[str, Any] | None = None  # the final status row of a terminal job, once recorded

    def status(self) -> dict[str, Any]:
        """The job's status as last recorded (what ``orch status`` shows when it does not ask
        the host): ``detail`` with the record's ``state`` and ``job_id``."""
        return dict(self.detail, state=self.state, job_id=self.job_id)


class Registry:
    def __init__(self, home: Path | None = None) -> None:
        """Open (or create) ``registry.db``. A file that is not a sound orch registry —
        garbage, truncated, another program's database — raises ``LocalFileError`` (exit 2)
        naming it and the fix, before any command acts on it."""
        self.path = (home or orch_home()) / "registry.db"
        try:
            with closing(self._connect()) as db, db:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute(SCHEMA)
                problems = [row[0] for row in db.execute("PRAGMA quick_check").fetchall()]
                columns = {row[1] for row in db.execute("PRAGMA table_info(jobs)").fetchall()}
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise  # another orch holds it past the busy timeout: not damage
            raise self.damaged(exc) from None
        except sqlite3.DatabaseError as exc:
            raise self.damaged(exc) from None
        if problems != ["ok"]:
            raise self.damaged("; ".join(str(p) for p in problems[:2]))
        if not COLUMNS <= columns:
            raise self.damaged(f"its jobs table lacks {', '.join(sorted(COLUMNS - columns))}: not orch's registry")
        self.path.chmod(0o600)

    def damaged(self, reason: object) -> LocalFileError:
        """The one message for a registry that cannot be used, with the way out: the jobs
        themselves live on their hosts, so moving the file aside loses only this laptop's list."""
        return LocalFileError(
            f"{self.path} is damaged ({reason}): move it aside (mv {self.path} {self.path}.damaged, and any "
            f"{self.path.name}-wal / -shm beside it) and orch starts an empty registry; the jobs themselves "
            "and their files stay on their hosts (under the host's root, jobs/<job_id>/)")

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path, timeout=30)
            db.execute("PRAGMA busy_timeout=30000")
        except sqlite3.OperationalError as exc:  # not a file sqlite can open (a folder, no permission)
            raise LocalFileError(f"cannot open {self.path} ({exc}): it must be a file this user can read "
                                 "and write") from None
        return db

    def add(self, job_id: str, name: str, spec_path: str, hosts: list[str], job_dir: str, state: str,
            detail: dict[str, Any] | None = None) -> None:
        now = time.time()
        with closing(self._connect()) as db, db:
            db.execute(
                "INSERT OR IGNORE INTO jobs VALUES (?,?,?,?,?,?,?,?,?)",
                (job_id, name, spec_path, json.dumps(hosts), job_dir, now, state, json.dumps(detail or {}), now),
            )

    def unconfirmed(self, submission: str) -> JobRecord | None:
        """The job reserved by an interrupted submit with this submission key, if any."""
        for record in self._rows("WHERE state = ?", (SUBMITTING,)):
            if record.detail.get("submission") == submission:
                return record
        return None

    def update(self, job_id: str, state: str, detail: dict[str, Any] | None = None) -> None:
        """Record the job's ``state`` and status ``detail``. A recorded final row is kept
        when the state stays the same terminal state (``orch logs`` of a finished job records
        the same end again) and dropped otherwise (``orch resume``)."""
        detail = {k: v for k, v in (detail or {}).items() if k != FINAL_KEY}
        with closing(self._connect()) as db, db:
            db.execute("BEGIN IMMEDIATE")  # read the old row and write the new one as one step
            row = db.execute("SELECT state, detail FROM jobs WHERE job_id=?", (job_id,)).fetchone()
            kept = row is not None and row[0] == state and state in TERMINAL
            final = _final(_loads(row[1]).get(FINAL_KEY)) if kept else None
            if final is not None:
                detail[FINAL_KEY] = final
            db.execute(
                "UPDATE jobs SET state=?, detail=?, updated=? WHERE job_id=?",
                (state, json.dumps(detail), time.time(), job_id),
            )

    def move(self, job_id: str, hosts: list[str], job_dir: str, detail: dict[str, Any]) -> None:
        """The job now lives on ``hosts`` in ``job_dir`` (``orch resume --on``), pending there."""
        with closing(self._connect()) as db, db:
            db.execute("UPDATE jobs SET hosts=?, job_dir=?, state=?, detail=?, updated=? WHERE job_id=?",
                       (json.dumps(hosts), job_dir, "pending", json.dumps(detail), time.time(), job_id))

    def record_final(self, job_id: str, state: str, row: dict[str, Any]) -> bool:
        """Keep ``row`` (JSON-able) as the final status row of a job recorded as terminal
        ``state``; nothing when its state is another by now. True when it was recorded."""
        if state not in TERMINAL:
            return False
        with closing(self._connect()) as db, db:
            db.execute("BEGIN IMMEDIATE")
            found = db.execute("SELECT detail FROM jobs WHERE job_id=? AND state=?", (job_id, state)).fetchone()
            if found is None:
                return False
            detail = _loads(found[0])
            detail[FINAL_KEY] = row
            db.execute("UPDATE jobs SET detail=? WHERE job_id=?", (json.dumps(detail), job_id))
        return True

    def _rows(self, where: str = "", args: tuple[Any, ...] = ()) -> Iterator[JobRecord]:
        with closing(self._connect()) as db:
            rows = db.execute(
                "SELECT job_id,name,spec_path,hosts,job_dir,created,state,detail FROM jobs "
                + where + " ORDER BY created", args
            ).fetchall()
        for r in rows:
            detail = _loads(r[7])
            final = _final(detail.pop(FINAL_KEY, None))
            yield JobRecord(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6], detail,
                            final if r[6] in TERMINAL else None)

    def all(self) -> list[JobRecord]:
        return list(self._rows())

    def get(self, job_id: str) -> JobRecord:
        """An exact id, or a unique prefix of one; ``UsageError`` otherwise."""
        exact = list(self._rows("WHERE job_id = ?", (job_id,)))
        if exact:
            return exact[0]
        like = job_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        matches = list(self._rows("WHERE job_id LIKE ? ESCAPE '\\'", (like,)))
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise UsageError(f"no job {job_id!r} (see `orch ls`)")
        more = f", and {len(matches) - LISTED} more" if len(matches) > LISTED else ""
        raise UsageError(f"{job_id!r} matches several jobs ({len(matches)}): "
                         + ", ".join(m.job_id for m in matches[:LISTED]) + more + "; give more of the id")


def _loads(text: str) -> dict[str, Any]:
    """A ``detail`` column as a dict (``{}`` for anything else)."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _final(value: Any) -> dict[str, Any] | None:
    return value if isinstance(value, dict) else None


def short_ids(ids: Iterable[str]) -> dict[str, str]:
    """Each id's shortest prefix that no other id of ``ids`` starts with, so that
    ``Registry.get`` resolves it to that id when ``ids`` are all the registry's jobs — but
    never shorter than the job's name (``<name>-<yyyymmdd-hhmmss>-<4 hex>``), so the short
    form still says which job it is. An id that begins another id stays whole (``get``
    prefers an exact id). Pure: sort, then compare each id with its neighbours."""
    unique = sorted(set(ids))
    out: dict[str, str] = {}
    for k, job_id in enumerate(unique):
        shared = 0
        for other in unique[max(k - 1, 0):k] + unique[k + 1:k + 2]:
            shared = max(shared, len(os.path.commonprefix([job_id, other])))
        tail = _ID_TAIL.search(job_id)
        out[job_id] = job_id[:max(shared + 1, tail.start() if tail else 1)]
    return out

"""The local job registry: SQLite under ``ORCH_HOME`` (WAL, busy timeout).

Safe with several ``orch`` processes at once: every write is one short transaction.
It caches what the hosts say; the hosts' ``status.json`` files stay the truth — until a job is
terminal (``TERMINAL``): a job never leaves those states by itself, so the record is then the
job's final word and ``orch status`` renders it without asking the host. Beside the status
(``detail``) a terminal job keeps its final status row (``final``: what ``orch status`` showed
when it first saw the job terminal, with the step total and cost that needed the spec and the
inventory); it is kept while the job stays in that state and dropped when the state changes.
Sweeps (``orch submit --sweep``, docs/sweeps.md) are a table of their own, ``sweep_jobs``: a
job's sweep, its combination number and values, written with the job's row and never touched
by ``update`` (which replaces ``detail`` wholesale), and a ``summary`` of a finished job
(its best eval loss) so ``orch status --sweep`` of finished jobs asks no host.
The file's layout version, its migrations and the rules that let an older and a newer orch
share it (every column named in every read and write) are ``layout.py``'s.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from orchestrator.errors import LocalFileError, UsageError
from orchestrator.home import orch_home
from orchestrator.state import db as db_file
from orchestrator.state import fences, layout
from remote_payload.contract import protocol

TERMINAL = protocol.TERMINAL  # a job never leaves these states by itself
SUBMITTING = "submitting"  # reserved by a submit that has not yet seen its launch confirmed
LISTED = 8  # ids an ambiguous prefix's error names before "and N more"
_ID_TAIL = re.compile(r"-\d{8}-\d{6}-[0-9a-f]{4}$")  # plan.make_job_id: <name>-<yyyymmdd-hhmmss>-<4 hex>

# The tables are layout.py's (which makes them and migrates an older file forward); every read
# and write here names its columns.
JOB_COLUMNS = "job_id, name, spec_path, hosts, job_dir, created, state, detail, updated"
SWEEP_COLUMNS = "job_id, sweep, combination, combinations, vals, summary"
# The final status row lives inside ``detail`` under this key (no new column: an older orch
# sharing this ORCH_HOME keeps working); ``JobRecord.detail`` never shows it.
FINAL_KEY = "_orch_final_row"
# The names of the job's ``secret_env`` (never their values), kept the same way through every
# ``update`` and ``move``: ``orch resume`` reads those variables on the laptop again and trusts
# no server to name them. ``JobRecord.secret_env``.
SECRET_NAMES_KEY = "_orch_secret_env"
# The hosts from which this laptop fetched the job's outputs, each verified whole after the job
# ended (``orch fetch``): ``{host: time}``, kept the same way. ``orch gc`` removes such a job's
# folder there (``JobRecord.fetched``; ``record_fetched``).
FETCHED_KEY = "_orch_fetched"
# The job's ``launch.ports`` (what ``orch tunnel JOB`` opens; ``JobRecord.ports``), kept the same way.
PORTS_KEY = "_orch_ports"
KEPT_KEYS = (SECRET_NAMES_KEY, FETCHED_KEY, PORTS_KEY)
# Keys of ``detail`` that are orch's own, not the host's status: this orch knows these two; any
# other key with this prefix was written by a newer orch (layout.py's rules) and is kept through
# ``update`` and ``move`` as ``KEPT_KEYS`` are, and never shown.
PRIVATE = "_orch_"


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
    secret_env: list[str] = field(default_factory=list)  # the names of its secret_env (values never)
    fetched: dict[str, float] = field(default_factory=dict)  # host -> when its outputs were fetched, verified
    ports: list[int] = field(default_factory=list)  # its launch.ports: what `orch tunnel JOB` opens

    def status(self) -> dict[str, Any]:
        """The job's status as last recorded (what ``orch status`` shows when it does not ask
        the host): ``detail`` with the record's ``state`` and ``job_id``."""
        return dict(self.detail, state=self.state, job_id=self.job_id)


@dataclass(frozen=True)
class SweepEntry:
    """A job's place in a sweep: combination ``combination`` of ``combinations`` (from 1), its
    ``values`` as ``[key, value, spelled]`` lists, and what was kept once it finished."""

    sweep: str
    combination: int
    combinations: int
    values: list[list[Any]]
    summary: dict[str, Any] = field(default_factory=dict)

    def pairs(self) -> list[tuple[str, str]]:
        """(key, spelled value) per swept key, in the sweep's order."""
        return [(str(v[0]), str(v[2])) for v in self.values if isinstance(v, list) and len(v) == 3]


def _wal(db: sqlite3.Connection, wait_s: float = db_file.BUSY_WAIT_S) -> None:
    """Switch to WAL. Switching needs the database to itself, and SQLite answers "locked" at
    once (no busy wait) while another process creates it: try again for up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Registry:
    def __init__(self, home: Path | None = None) -> None:
        """Open (or create) ``registry.db``. A file that is not a sound orch registry —
        garbage, truncated, another program's database — raises ``LocalFileError`` (exit 2)
        naming it and the fix, before any command acts on it."""
        self.path = (home or orch_home()) / "registry.db"
        try:
            with closing(self._connect()) as db, db:
                _wal(db)
                problems = [row[0] for row in db.execute("PRAGMA quick_check").fetchall()]
                if problems != ["ok"]:
                    raise self.damaged("; ".join(str(p) for p in problems[:2]))
                layout.prepare(db, self.path)  # too new for this orch: refused, left as it is; older: migrated
        except sqlite3.OperationalError as exc:
            if db_file.is_busy(exc):
                raise db_file.busy(self.path) from None  # another orch holds it past the wait: not damage
            raise self.damaged(exc) from None
        except (sqlite3.DatabaseError, ValueError) as exc:
            raise self.damaged(exc) from None
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
            db = db_file.connect(self.path)
        except sqlite3.OperationalError as exc:  # not a file sqlite can open (a folder, no permission)
            raise LocalFileError(f"cannot open {self.path} ({exc}): it must be a file this user can read "
                                 "and write") from None
        return db

    def add(self, job_id: str, name: str, spec_path: str, hosts: list[str], job_dir: str, state: str,
            detail: dict[str, Any] | None = None, sweep: SweepEntry | None = None,
            secret_env: list[str] | None = None, ports: list[int] | None = None) -> None:
        """Record a new job (nothing when the id is already there); with ``sweep``, its place in
        that sweep, in the same transaction; ``secret_env``: the names only; ``ports``: its
        ``launch.ports``."""
        now = time.time()
        detail = dict(detail or {}, **({SECRET_NAMES_KEY: list(secret_env)} if secret_env else {}),
                      **({PORTS_KEY: list(ports)} if ports else {}))
        with db_file.writing(self.path) as db:
            db.execute(
                f"INSERT OR IGNORE INTO jobs ({JOB_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)",
                (job_id, name, spec_path, json.dumps(hosts), job_dir, now, state, json.dumps(detail or {}), now),
            )
            if sweep is not None:
                db.execute(f"INSERT OR IGNORE INTO sweep_jobs ({SWEEP_COLUMNS}) VALUES (?,?,?,?,?,?)",
                           (job_id, sweep.sweep, sweep.combination, sweep.combinations, json.dumps(sweep.values),
                            json.dumps(sweep.summary)))

    def sweep_jobs(self, sweep: str) -> list[tuple[JobRecord, SweepEntry]]:
        """The jobs of ``sweep`` with their entries, by combination (empty for an unknown name)."""
        with closing(self._connect()) as db:
            rows = db.execute("SELECT job_id FROM sweep_jobs WHERE sweep=? ORDER BY combination, job_id",
                              (sweep,)).fetchall()
        entries = self.sweep_entries([r[0] for r in rows])
        records = {r.job_id: r for r in self._rows("WHERE job_id IN (SELECT job_id FROM sweep_jobs WHERE sweep=?)",
                                                   (sweep,))}
        return [(records[r[0]], entries[r[0]]) for r in rows if r[0] in records and r[0] in entries]

    def sweep_entries(self, job_ids: list[str]) -> dict[str, SweepEntry]:
        """The sweep entry of each of ``job_ids`` that belongs to a sweep."""
        out: dict[str, SweepEntry] = {}
        with closing(self._connect()) as db:
            for start in range(0, len(job_ids), 500):
                chunk = job_ids[start:start + 500]
                marks = ",".join("?" * len(chunk))
                for row in db.execute("SELECT job_id, sweep, combination, combinations, vals, summary FROM sweep_jobs "
                                      f"WHERE job_id IN ({marks})", chunk).fetchall():
                    values = _json(row[4], list)
                    out[row[0]] = SweepEntry(row[1], int(row[2]), int(row[3]), values or [], _loads(row[5]))
        return out

    def sweep_names(self) -> list[str]:
        """Every sweep's name, the newest first."""
        with closing(self._connect()) as db:
            rows = db.execute("SELECT s.sweep, MAX(j.created) FROM sweep_jobs s JOIN jobs j ON j.job_id = s.job_id "
                              "GROUP BY s.sweep ORDER BY 2 DESC").fetchall()
        return [r[0] for r in rows]

    def record_sweep_summary(self, job_id: str, summary: dict[str, Any]) -> None:
        """Keep ``summary`` (JSON-able) with the job's sweep entry: what ``orch status --sweep``
        needs of a finished job."""
        with db_file.writing(self.path) as db:
            db.execute("UPDATE sweep_jobs SET summary=? WHERE job_id=?", (json.dumps(summary), job_id))

    def unconfirmed(self, submission: str) -> JobRecord | None:
        """The job reserved by an interrupted submit with this submission key, if any."""
        for record in self._rows("WHERE state = ?", (SUBMITTING,)):
            if record.detail.get("submission") == submission:
                return record
        return None

    def forget_reservation(self, job_id: str) -> bool:
        """Remove the job (and its sweep entry) while it is still only a reservation
        (``SUBMITTING``): its host was asked and holds no such job, so it never started and
        nothing counts it any more. False, and nothing removed, once it is anything else."""
        with db_file.writing(self.path) as db:  # read and write as one step
            gone = db.execute("DELETE FROM jobs WHERE job_id=? AND state=?", (job_id, SUBMITTING)).rowcount
            if gone:
                db.execute("DELETE FROM sweep_jobs WHERE job_id=?", (job_id,))
        return bool(gone)

    def update(self, job_id: str, state: str, detail: dict[str, Any] | None = None) -> None:
        """Record the job's ``state`` and status ``detail``. A recorded final row is kept
        when the state stays the same terminal state (``orch logs`` of a finished job records
        the same end again) and dropped otherwise (``orch resume``)."""
        detail = {k: v for k, v in (detail or {}).items() if not k.startswith(PRIVATE)}
        with db_file.writing(self.path) as db:  # read and write as one step
            row = db.execute("SELECT state, detail FROM jobs WHERE job_id=?", (job_id,)).fetchone()
            kept = row is not None and row[0] == state and state in TERMINAL
            final = _final(_loads(row[1]).get(FINAL_KEY)) if kept else None
            if final is not None:
                detail[FINAL_KEY] = final
            detail.update(_kept(row[1]) if row is not None else {})
            db.execute(
                "UPDATE jobs SET state=?, detail=?, updated=? WHERE job_id=?",
                (state, json.dumps(detail), time.time(), job_id),
            )

    def move(self, job_id: str, hosts: list[str], job_dir: str, detail: dict[str, Any],
             superseded: list[tuple[str, str]] | None = None) -> None:
        """The job now lives on ``hosts`` in ``job_dir`` (``orch resume --on``), pending there;
        in the same transaction its attempts on ``superseded`` ((host, folder) pairs: the hosts
        it left) are fenced (``fences.add``): durable before anything else happens."""
        with db_file.writing(self.path) as db:  # read and write as one step
            row = db.execute("SELECT detail FROM jobs WHERE job_id=?", (job_id,)).fetchone()
            detail = dict({k: v for k, v in detail.items() if not k.startswith(PRIVATE)}, **(_kept(row[0]) if row else {}))
            db.execute("UPDATE jobs SET hosts=?, job_dir=?, state=?, detail=?, updated=? WHERE job_id=?",
                       (json.dumps(hosts), job_dir, "pending", json.dumps(detail), time.time(), job_id))
            fences.add(db, job_id, superseded or [], hosts)

    def record_final(self, job_id: str, state: str, row: dict[str, Any]) -> bool:
        """Keep ``row`` (JSON-able) as the final status row of a job recorded as terminal
        ``state``; nothing when its state is another by now. True when it was recorded."""
        if state not in TERMINAL:
            return False
        with db_file.writing(self.path) as db:  # read and write as one step
            found = db.execute("SELECT detail FROM jobs WHERE job_id=? AND state=?", (job_id, state)).fetchone()
            if found is None:
                return False
            detail = _loads(found[0])
            detail[FINAL_KEY] = row
            db.execute("UPDATE jobs SET detail=? WHERE job_id=?", (json.dumps(detail), job_id))
        return True

    def record_fetched(self, job_id: str, host: str) -> None:
        """The job's outputs on ``host`` are on this laptop, each file verified, the job ended
        (``orch fetch``): ``orch gc`` may remove its folder there."""
        with db_file.writing(self.path) as db:  # read and write as one step
            row = db.execute("SELECT detail FROM jobs WHERE job_id=?", (job_id,)).fetchone()
            if row is None:
                return
            detail = _loads(row[0])
            fetched = detail.get(FETCHED_KEY) if isinstance(detail.get(FETCHED_KEY), dict) else {}
            detail[FETCHED_KEY] = dict(fetched, **{host: time.time()})
            db.execute("UPDATE jobs SET detail=? WHERE job_id=?", (json.dumps(detail), job_id))

    def forget(self, job_id: str) -> bool:
        """Remove the job's record (and its sweep entry): ``orch rm --local``. False when there was none."""
        with db_file.writing(self.path) as db:
            gone = db.execute("DELETE FROM jobs WHERE job_id=?", (job_id,)).rowcount
            db.execute("DELETE FROM sweep_jobs WHERE job_id=?", (job_id,))
        return bool(gone)

    def _rows(self, where: str = "", args: tuple[Any, ...] = ()) -> Iterator[JobRecord]:
        with closing(self._connect()) as db:
            rows = db.execute(
                "SELECT job_id,name,spec_path,hosts,job_dir,created,state,detail FROM jobs "
                + where + " ORDER BY created", args
            ).fetchall()
        for r in rows:
            detail = _loads(r[7])
            final = _final(detail.pop(FINAL_KEY, None))
            names = detail.pop(SECRET_NAMES_KEY, None)
            fetched = detail.pop(FETCHED_KEY, None)
            ports = detail.pop(PORTS_KEY, None)
            detail = {k: v for k, v in detail.items() if not k.startswith(PRIVATE)}  # a newer orch's own keys
            yield JobRecord(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6], detail,
                            final if r[6] in TERMINAL else None,
                            [n for n in names if isinstance(n, str)] if isinstance(names, list) else [],
                            {str(h): float(t) for h, t in fetched.items() if isinstance(t, (int, float))}
                            if isinstance(fetched, dict) else {},
                            [p for p in ports if type(p) is int] if isinstance(ports, list) else [])

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


def _kept(text: str) -> dict[str, Any]:
    """What ``update`` and ``move`` keep of a ``detail`` column: the ``KEPT_KEYS``, and every
    ``PRIVATE`` key a newer orch wrote (all but ``FINAL_KEY``, which ``update`` rules on)."""
    old = _loads(text)
    return {k: v for k, v in old.items() if k in KEPT_KEYS or (k.startswith(PRIVATE) and k != FINAL_KEY)}


def _loads(text: str) -> dict[str, Any]:
    """A ``detail`` column as a dict (``{}`` for anything else)."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _json(text: str, kind: type) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, kind) else None


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

"""registry.db across orch versions (issue 38 item 8): an older file is migrated forward, a
newer one an older orch can use is shared (every read and write names its columns), and one it
cannot use is refused naming the file, its writer and the way out. Real SQLite files made with
each layout's own DDL; the behaviour through the CLI (refused before anything connects) is
tests/e2e/faults/test_registry_versions.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from orchestrator import __version__
from orchestrator.errors import LocalFileError
from orchestrator.state import fences, kits, layout, reach
from orchestrator.state.registry import FINAL_KEY, Registry, SweepEntry

# registry.db as orch wrote it before sweeps (layout 0, no meta): the jobs table alone.
BEFORE_SWEEPS = """
CREATE TABLE jobs (job_id TEXT PRIMARY KEY, name TEXT NOT NULL, spec_path TEXT NOT NULL, hosts TEXT NOT NULL,
                   job_dir TEXT NOT NULL, created REAL NOT NULL, state TEXT NOT NULL,
                   detail TEXT NOT NULL DEFAULT '{}', updated REAL NOT NULL)
"""
JOB = "old-20261101-101500-1a2b"


def meta(db: Path) -> dict[str, str]:
    with sqlite3.connect(db) as conn:
        return dict(conn.execute("SELECT key, value FROM meta").fetchall())


def tables(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_a_registry_from_before_layouts_is_migrated_forward_keeping_its_jobs(tmp_path: Path) -> None:
    db = tmp_path / "registry.db"
    with sqlite3.connect(db) as conn:
        conn.execute(BEFORE_SWEEPS)
        conn.execute("INSERT INTO jobs VALUES (?,?,?,?,?,?,?,?,?)",
                     (JOB, "old", "old.yaml", '["box"]', "/r/jobs/" + JOB, 1.0, "succeeded", '{"exit_code": 0}', 2.0))
    registry = Registry(tmp_path)
    assert meta(db) == {"layout": str(layout.LAYOUT), "compatible": str(layout.COMPATIBLE), "written_by": __version__}
    assert {"jobs", "sweep_jobs", "reach", "kits", "fences", "meta"} <= tables(db)
    (record,) = registry.all()
    assert (record.job_id, record.hosts, record.state, record.detail) == (JOB, ["box"], "succeeded", {"exit_code": 0})
    registry.add("new-20261201-101500-3c4d", "new", "n.yaml", ["box"], "/r/jobs/n", "running",
                 sweep=SweepEntry("s", 1, 2, [["lr", 0.1, "0.1"]]))
    assert registry.sweep_names() == ["s"]
    Registry(tmp_path)  # opening a current file again changes nothing
    assert meta(db)["layout"] == str(layout.LAYOUT) and len(registry.all()) == 2


def test_another_programs_jobs_table_is_damage_and_is_never_migrated(tmp_path: Path) -> None:
    db = tmp_path / "registry.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, title TEXT)")
    with pytest.raises(LocalFileError, match="is damaged .*not orch's registry"):
        Registry(tmp_path)
    assert tables(db) == {"jobs"}  # nothing of orch's was written into it


def _newer(db: Path, compatible: int, not_null: bool = False) -> None:
    """Make ``db`` what a newer orch (layout LAYOUT + 1) would leave: a column more in every table
    (a default, so an older orch's inserts fill it; or NOT NULL without one), its own detail key."""
    with sqlite3.connect(db) as conn:
        for table in layout.TABLES:
            if not_null and table == "jobs":  # only a rebuilt table can have one: ALTER TABLE refuses it
                conn.execute("ALTER TABLE jobs RENAME TO old_jobs")
                conn.execute(layout.JOBS.replace("updated REAL NOT NULL", "updated REAL NOT NULL, owner TEXT NOT NULL"))
                conn.execute("DROP TABLE old_jobs")
            else:
                conn.execute(f"ALTER TABLE {table} ADD COLUMN later TEXT NOT NULL DEFAULT 'x'")
        conn.executemany("UPDATE meta SET value=? WHERE key=?", [(str(layout.LAYOUT + 1), "layout"),
                                                                 (str(compatible), "compatible"),
                                                                 ("9.9.9", "written_by")])
        conn.execute("UPDATE jobs SET detail=? WHERE job_id=?",
                     (json.dumps({"exit_code": 0, "_orch_later": [1]}), JOB))


def test_a_newer_registry_that_stays_compatible_is_read_and_written_by_column_name(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    registry.add(JOB, "old", "old.yaml", ["a"], "/r/jobs/" + JOB, "running")
    _newer(registry.path, compatible=layout.LAYOUT)
    registry = Registry(tmp_path)
    assert registry.get(JOB).detail == {"exit_code": 0}  # the newer orch's own key is not shown...
    registry.update(JOB, "succeeded", {"exit_code": 0})
    assert registry.record_final(JOB, "succeeded", {"row": 1})
    registry.move(JOB, ["b"], "/r2/jobs/" + JOB, {"state": "pending"}, superseded=[("a", "/r/jobs/" + JOB)])
    registry.add("two-20261201-101500-3c4d", "two", "t.yaml", ["b"], "/r/jobs/t", "running",
                 sweep=SweepEntry("s", 1, 1, [["lr", 0.1, "0.1"]]))
    registry.record_sweep_summary("two-20261201-101500-3c4d", {"best": 1.0})
    reach.record(registry.path, "a", ok=False, error="gone")
    kits.record(registry.path, JOB, tmp_path / "runs" / JOB)
    (fence,) = fences.pending(registry.path, host="a")
    assert fences.settle(registry.path, fence, "stopped")
    assert [r.job_id for r in registry.all()] == [JOB, "two-20261201-101500-3c4d"]
    assert registry.sweep_jobs("s")[0][1].summary == {"best": 1.0}
    assert reach.get(registry.path, "a").error == "gone" and kits.recorded(registry.path, JOB)
    with sqlite3.connect(registry.path) as conn:
        detail = json.loads(conn.execute("SELECT detail FROM jobs WHERE job_id=?", (JOB,)).fetchone()[0])
        assert detail.get("_orch_later") == [1] and FINAL_KEY not in detail  # ...and kept through update and move
        for table in layout.TABLES:  # every row this orch wrote left the newer column to its default
            assert {r[0] for r in conn.execute(f"SELECT later FROM {table}")} == {"x"}
    assert meta(registry.path) == {"layout": str(layout.LAYOUT + 1), "compatible": str(layout.LAYOUT),
                                   "written_by": "9.9.9"}  # never lowered


@pytest.mark.parametrize("compatible,not_null", [(layout.LAYOUT + 1, False), (layout.LAYOUT, True)])
def test_a_newer_registry_this_orch_cannot_use_is_refused_and_left_as_it_is(
        tmp_path: Path, compatible: int, not_null: bool) -> None:
    registry = Registry(tmp_path)
    registry.add(JOB, "old", "old.yaml", ["a"], "/r/jobs/" + JOB, "running")
    _newer(registry.path, compatible=compatible, not_null=not_null)
    before = registry.path.read_bytes()
    with pytest.raises(LocalFileError) as refused:
        Registry(tmp_path)
    message = str(refused.value)
    for needle in (str(registry.path), "written by orch 9.9.9", f"registry layout {layout.LAYOUT + 1}",
                   f"knows layouts up to {layout.LAYOUT}", "upgrade orch (pip install -U orch-gpu)", "ORCH_HOME="):
        assert needle in message
    assert ("column 'owner'" in message) == not_null
    assert registry.path.read_bytes() == before


def test_a_meta_table_without_a_layout_is_damage(tmp_path: Path) -> None:
    db = Registry(tmp_path).path
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE meta SET value='two' WHERE key='layout'")
    with pytest.raises(LocalFileError, match="is damaged .*no layout version"):
        Registry(tmp_path)

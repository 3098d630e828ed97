"""ORCH_HOME/registry.db written by another orch version (issue 38 item 8), through the real CLI
against the loopback sshd: an older file is migrated forward, a newer one with a column more is
shared, and one this orch cannot use stops every command with exit 2 naming the file, the orch
that wrote it and the way out — before anything connects, syncs or launches. The layouts
themselves: tests/orchestrator/state/test_registry_layout.py."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from orchestrator.state import layout, reach
from tests.e2e.faults.test_local_faults import assert_clean
from tests.support.orch import Orch, write_job
from tests.support.poll import wait_until

OLD_JOB = "old-20261101-101500-1a2b"


def remote_tree(orch: Orch) -> list[str]:
    """Every path under the hosts' roots (the sshd's and `local`'s): what a command left there."""
    roots = [orch.remote_root, orch.home / "local"]
    return sorted(str(p) for root in roots if root.exists() for p in root.rglob("*"))


def processes_naming(word: str) -> list[int]:
    """Pids of this machine's processes whose command line holds ``word`` (the loopback box runs here)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if word.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def dump(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return list(conn.iterdump())


def test_a_registry_from_before_layouts_is_migrated_and_one_with_a_newer_column_is_shared(orch: Orch, box: str) -> None:
    db = orch.home / "registry.db"
    with sqlite3.connect(db) as conn:  # as orch wrote it before sweeps and layouts
        conn.execute("CREATE TABLE jobs (job_id TEXT PRIMARY KEY, name TEXT NOT NULL, spec_path TEXT NOT NULL, "
                     "hosts TEXT NOT NULL, job_dir TEXT NOT NULL, created REAL NOT NULL, state TEXT NOT NULL, "
                     "detail TEXT NOT NULL DEFAULT '{}', updated REAL NOT NULL)")
        conn.execute("INSERT INTO jobs VALUES (?,?,?,?,?,?,?,?,?)", (OLD_JOB, "old", "old.yaml", '["box"]',
                                                                     "/gone/jobs/" + OLD_JOB, 1.0, "succeeded",
                                                                     '{"exit_code": 0}', 2.0))
    assert [j["job_id"] for j in orch.json("status")] == [OLD_JOB]
    with sqlite3.connect(db) as conn:
        assert dict(conn.execute("SELECT key, value FROM meta"))["layout"] == str(layout.LAYOUT)
        # The case: a newer orch added a column to jobs (and says the file stays usable).
        conn.execute("ALTER TABLE jobs ADD COLUMN priority INTEGER NOT NULL DEFAULT 5")
        conn.execute("UPDATE meta SET value=? WHERE key='layout'", (str(layout.LAYOUT + 1),))
    spec = write_job(orch.cwd, "shared", box, ["python", "-c", "print('ran')"])
    job = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]
    assert {j["job_id"]: j["state"] for j in orch.json("status")} == {OLD_JOB: "succeeded", job: "succeeded"}
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT priority FROM jobs WHERE job_id=?", (job,)).fetchone() == (5,)


@pytest.mark.parametrize("newer", ["a raised compatible layout", "a column that must be filled in"])
def test_a_registry_this_orch_cannot_use_is_refused_before_anything_connects(orch: Orch, box: str, newer: str) -> None:
    spec = write_job(orch.cwd, "kept", box, ["python", "-c", "print('done')"])
    job = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]
    # The job's supervisor still writes after the job ended (the late environment record in
    # <root>/state/environment, on_finish): the snapshot below is taken once it has exited.
    wait_until(lambda: not processes_naming(job), what=f"{job}'s supervisor to exit", timeout=120)
    db = orch.home / "registry.db"
    with sqlite3.connect(db) as conn:  # what a newer orch that an older one must not use leaves behind
        if newer == "a column that must be filled in":  # a rebuilt table: ALTER TABLE cannot add one
            conn.execute("DROP TABLE reach")
            conn.execute(reach.SCHEMA.replace("error TEXT", "owner TEXT NOT NULL, error TEXT"))
        conn.executemany("UPDATE meta SET value=? WHERE key=?", [
            (str(layout.LAYOUT + 1), "layout"), ("9.9.9", "written_by"),
            (str(layout.LAYOUT + (newer == "a raised compatible layout")), "compatible")])
    before, tree = dump(db), remote_tree(orch)
    (orch.cwd / "ws" / "new.py").write_text("print('never synced')\n")
    for args in (["status"], ["submit", str(spec)], ["logs", job], ["fetch", job], ["cancel", job]):
        out = orch(*args, check=None)
        assert_clean(out, str(db), "written by orch 9.9.9", f"knows layouts up to {layout.LAYOUT}",
                     "upgrade orch (pip install -U orch-gpu)")
    assert remote_tree(orch) == tree  # nothing synced, launched, fetched or cancelled on any host
    assert dump(db) == before  # the file left as it was
    assert not (orch.cwd / "runs").exists()

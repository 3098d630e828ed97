"""Sync state as deltas (local and the loopback sshd): ``hello`` leaves the record out when the
laptop holds its generation, a sync sends only the changed entries and the laptop's copy stays
equal to the server's record; a missing or stale copy falls back to the whole record."""

from __future__ import annotations

import json
import os
from pathlib import Path

from orchestrator.helper.remote import Remote
from orchestrator.sync import record as synccache
from orchestrator.sync import selection
from tests.support.orch import run_sync, tree


def _ws(tmp_path: Path, n: int = 30) -> Path:
    ws = tmp_path / "proj"
    (ws / "src").mkdir(parents=True)
    for i in range(n):
        (ws / "src" / f"m{i}.py").write_text(f"x = {i}\n")
    return ws


def _server_record(remote: Remote, ws: Path) -> dict:
    path = Path(remote.host.root) / "state" / f"sync-{selection.project_name(ws)}.json"
    return json.loads(path.read_text())


def test_the_laptops_copy_is_the_servers_record_and_hello_leaves_it_out(remote: Remote, tmp_path: Path) -> None:
    ws = _ws(tmp_path)
    project = selection.project_name(ws)
    run_sync(remote, ws)
    record = _server_record(remote, ws)
    assert synccache.load(remote.host, project) == (record["generation"], record["files"])
    raw = remote.call("hello", project=project, known=record["generation"])["sync"]
    assert raw["same"] is True and "files" not in raw
    plan, summary = run_sync(remote, ws)
    assert plan.noop and summary["bytes"] == 0

    (ws / "src" / "m3.py").write_text("x = 'changed'\n")
    (ws / "src" / "m4.py").unlink()
    (ws / "src" / "new.py").write_text("y = 1\n")
    plan, _ = run_sync(remote, ws)
    assert plan.control()["changed"].keys() == {"src/m3.py", "src/new.py"} and plan.control()["delete"] == ["src/m4.py"]
    assert "entries" not in plan.control()  # the other 28 entries never travel
    record = _server_record(remote, ws)
    assert synccache.load(remote.host, project) == (record["generation"], record["files"])
    assert set(record["files"]) == {f"src/m{i}.py" for i in range(30) if i != 4} | {"src/new.py"}
    dest = Path(remote.host.root) / "workspace" / project
    assert tree(dest) == tree(ws)


def test_a_lost_or_stale_copy_falls_back_to_the_whole_record(remote: Remote, tmp_path: Path) -> None:
    ws = _ws(tmp_path)
    project = selection.project_name(ws)
    run_sync(remote, ws)
    synccache.store(remote.host, project, None, {})  # lost (a new ORCH_HOME, a cleaned cache)
    plan, _ = run_sync(remote, ws)
    assert plan.noop and synccache.load(remote.host, project) is not None
    synccache.store(remote.host, project, "0123456789abcdef", {"src/m1.py": {"size": 1}})  # stale generation
    state = synccache.hello(remote, project)["sync"]
    assert state["files"] == _server_record(remote, ws)["files"]
    path = synccache._path(remote.host, project)
    path.write_text("{not json")  # broken: not used
    assert synccache.hello(remote, project)["sync"]["files"] == _server_record(remote, ws)["files"]


def test_a_sync_planned_from_an_older_record_still_lands_and_drops_the_copy(remote: Remote, tmp_path: Path) -> None:
    """Two submits of one checkout at once: both plan from the same record, the second lands
    on the record the first left. Its changes apply to that record; the laptop's copy is
    dropped (its base is gone) and the next hello brings the whole record."""
    ws = _ws(tmp_path)
    project = selection.project_name(ws)
    run_sync(remote, ws)
    (ws / "src" / "m1.py").write_text("x = 'first'\n")
    (ws / "src" / "m2.py").write_text("x = 'second'\n")
    state = synccache.hello(remote, project)["sync"]
    files = selection.select_files(ws, [])
    first = selection.plan_sync(ws, files, state, False)
    second = selection.plan_sync(ws, files, state, False)
    from orchestrator.sync.send import send

    send(remote, project, ws, first)
    send(remote, project, ws, second)
    assert synccache.load(remote.host, project) is None
    dest = Path(remote.host.root) / "workspace" / project
    assert tree(dest) == tree(ws)
    record = _server_record(remote, ws)
    assert set(record["files"]) == set(files)
    os.utime(ws / "src" / "m5.py")
    plan, _ = run_sync(remote, ws)  # whole record again, then deltas
    assert not plan.send and synccache.load(remote.host, project) == (_server_record(remote, ws)["generation"],
                                                                        _server_record(remote, ws)["files"])

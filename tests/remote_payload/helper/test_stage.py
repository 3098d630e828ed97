"""The server's staging of a submit's tree (remote_payload/helper/stage.py) on a real folder:
what it verifies, what it refuses. Through the CLI and a real sshd:
tests/e2e/faults/test_fault_submits.py."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from remote_payload.helper import stage, workspace
from remote_payload.helper.workspace import SyncError
from remote_payload.jobdir import lease


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def recorded(path: Path, digest: str) -> dict:
    st = path.lstat()
    return {"sha256": digest, "rsize": st.st_size, "rmtime_ns": st.st_mtime_ns}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    ws = tmp_path / "root" / "workspace" / "p"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "a.py").write_bytes(b"a1")
    (ws / "data").mkdir()
    (ws / "link-to-data").symlink_to("data")
    return ws


def test_the_tree_is_staged_linked_and_a_folder_symlink_kept_as_a_link(ws: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    tree = {"pkg/a.py": [sha(b"a1"), None], "link-to-data": [None, "data"]}
    record = {"pkg/a.py": recorded(ws / "pkg" / "a.py", sha(b"a1"))}
    assert stage.stage(str(root), str(ws), {"token": "j-0", "tree": tree}, record, {}, lambda: None) == {"staged": 2}
    staged = root / "staged" / "j-0"
    assert (staged / "pkg" / "a.py").stat().st_ino == (ws / "pkg" / "a.py").stat().st_ino
    assert os.readlink(staged / "link-to-data") == "data"
    code = tmp_path / "job" / "code"
    code.parent.mkdir()
    assert stage.take(str(root), "j-0", str(code), last=True) == ["link-to-data", "pkg/a.py"]
    assert not staged.exists()


def test_a_file_replaced_since_the_laptop_planned_is_named_and_nothing_is_staged(ws: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (ws / "pkg" / "a.py").write_bytes(b"a2")  # another sync replaced it
    record = {"pkg/a.py": recorded(ws / "pkg" / "a.py", sha(b"a2"))}
    tree = {"pkg/a.py": [sha(b"a1"), None], "link-to-data": [None, "elsewhere"], "gone.py": [sha(b"x"), None]}
    answer = stage.stage(str(root), str(ws), {"token": "j-0", "tree": tree}, record, {}, lambda: None)
    assert answer == {"differ": ["gone.py", "link-to-data", "pkg/a.py"]}
    assert not (root / "staged" / "j-0").exists() and not list((root / "staged").iterdir())


def test_an_edit_the_record_does_not_know_is_caught_by_hashing(ws: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    record = {"pkg/a.py": recorded(ws / "pkg" / "a.py", sha(b"a1"))}
    (ws / "pkg" / "a.py").write_bytes(b"b1")  # same size, edited in place on the server
    answer = stage.stage(str(root), str(ws), {"token": "j-0", "tree": {"pkg/a.py": [sha(b"a1"), None]}},
                         record, {}, lambda: None)
    assert answer == {"differ": ["pkg/a.py"]}


@pytest.mark.parametrize("request_", [
    {"token": "../x", "tree": {}}, {"token": ".hidden", "tree": {}}, {"token": "j", "tree": []},
    {"token": "j", "tree": {"a": "not a pair"}},
])
def test_a_malformed_request_is_refused(ws: Path, tmp_path: Path, request_: dict) -> None:
    with pytest.raises(stage.StageError):
        stage.stage(str(tmp_path / "root"), str(ws), request_, {}, {}, lambda: None)


def test_a_path_leaving_the_workspace_is_refused(ws: Path, tmp_path: Path) -> None:
    with pytest.raises(SyncError):
        stage.stage(str(tmp_path / "root"), str(ws), {"token": "j", "tree": {"../../etc/passwd": ["0" * 64, None]}},
                    {}, {}, lambda: None)


def test_a_launch_without_its_staged_tree_says_to_submit_again(tmp_path: Path) -> None:
    with pytest.raises(stage.StageError, match="run the same orch submit again"):
        stage.take(str(tmp_path), "j-0", str(tmp_path / "code"), last=True)


def write_record(root: Path, ws: Path, generation: str) -> None:
    """The sync record a receive would have left for ``ws`` (project ``p``)."""
    entry = dict(recorded(ws / "pkg" / "a.py", sha(b"a1")), size=2, mtime_ns=1, mode=0o644, link=None)
    files = {"pkg/a.py": entry, "link-to-data": {"sha256": None, "link": "data", "size": 0, "mtime_ns": 1,
                                                  "mode": 0o777}}
    (root / "state").mkdir(exist_ok=True)
    (root / "state" / "sync-p.json").write_text(json.dumps({"files": files, "generation": generation}))


def test_a_resubmit_with_no_change_is_staged_from_the_servers_record(ws: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_record(root, ws, "g1")
    assert stage.from_record(str(root), "p", {"token": "j-0", "generation": "g1"}) == {"staged": 2}
    staged = root / "staged" / "j-0"
    assert (staged / "pkg" / "a.py").stat().st_ino == (ws / "pkg" / "a.py").stat().st_ino
    assert os.readlink(staged / "link-to-data") == "data"
    # the laptop held another generation of the record: nothing staged, it syncs as usual
    assert stage.from_record(str(root), "p", {"token": "j-1", "generation": "g0"}) == {"stale": True}
    assert not (root / "staged" / "j-1").exists()


def test_staging_from_the_record_verifies_each_file_and_never_waits_for_a_receive(ws: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    write_record(root, ws, "g1")
    (ws / "pkg" / "a.py").write_bytes(b"a2")  # edited on the server since the record
    assert stage.from_record(str(root), "p", {"token": "j-0", "generation": "g1"}) == {"differ": ["pkg/a.py"]}
    assert not (root / "staged" / "j-0").exists()
    held = lease.acquire(workspace.record_lock(str(root), "p"), "receive p")  # a receive in progress
    try:
        assert stage.from_record(str(root), "p", {"token": "j-0", "generation": "g1"}) == {"busy": True}
    finally:
        held.release()
    with pytest.raises(stage.StageError):
        stage.from_record(str(root), "p", {"token": "j-0"})

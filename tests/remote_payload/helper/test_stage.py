"""The server's staging of a submit's tree (remote_payload/helper/stage.py) on a real folder:
what it verifies, what it refuses. Through the CLI and a real sshd:
tests/e2e/faults/test_fault_submits.py."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from remote_payload.contract.protocol import tree_digest
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


def test_a_symlink_or_a_folder_where_the_laptop_has_a_file_is_named_and_never_staged(ws: Path, tmp_path: Path) -> None:
    """Whatever the server holds under a file's name that is not a regular file — a symlink,
    even to a file with the very bytes, or a folder — differs: the job would run something else."""
    root = tmp_path / "root"
    (ws / "same.py").symlink_to("pkg/a.py")  # the bytes the laptop means, through a link
    (ws / "folder.py").mkdir()
    tree = {"pkg/a.py": [sha(b"a1"), None], "same.py": [sha(b"a1"), None], "folder.py": [sha(b"a1"), None]}
    record = {rel: recorded(ws / "pkg" / "a.py", sha(b"a1")) for rel in tree}  # even a record that agrees
    answer = stage.stage(str(root), str(ws), {"token": "j-0", "tree": tree}, record, {}, lambda: None)
    assert answer == {"differ": ["folder.py", "same.py"]}
    assert not list((root / "staged").iterdir())


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


def test_a_digest_stages_the_tree_it_names_and_a_stale_one_nothing(ws: Path, tmp_path: Path) -> None:
    """The laptop sends the tree's digest: the server stages its own selection when it is that
    tree, and says ``stale`` (the laptop then sends the tree) when it is another."""
    root = tmp_path / "root"
    a = dict(recorded(ws / "pkg" / "a.py", sha(b"a1")), size=2, mtime_ns=1, mode=0o644, link=None)
    selection = {"pkg/a.py": a, "link-to-data": {"sha256": None, "link": "data", "size": 0, "mtime_ns": 1, "mode": 0}}
    laptops = {"pkg/a.py": [sha(b"a1"), None], "link-to-data": [None, "data"]}
    assert stage.tree_of(selection) == laptops
    answer = stage.stage(str(root), str(ws), {"token": "j-0", "digest": tree_digest(laptops)}, {"pkg/a.py": a}, {},
                         lambda: None, selection)
    assert answer == {"staged": 2}
    assert (root / "staged" / "j-0" / "pkg" / "a.py").read_bytes() == b"a1"
    planned = dict(laptops, **{"pkg/a.py": [sha(b"a0"), None]})  # the laptop planned another a.py
    answer = stage.stage(str(root), str(ws), {"token": "j-1", "digest": tree_digest(planned)}, {"pkg/a.py": a}, {},
                         lambda: None, selection)
    assert answer == {"stale": True} and not (root / "staged" / "j-1").exists()


def sync_stream(control: dict, files: dict[str, bytes]) -> io.BytesIO:
    """A receive's stream as the laptop writes it: ``.orch-sync.json``, then the files."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w|") as tar:
        for name, data in [(".orch-sync.json", json.dumps(control).encode()), *files.items()]:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    out.seek(0)
    return out


def laptop_entry(data: bytes, mtime_ns: int, digest: str | None = "") -> dict:
    return {"size": len(data), "mtime_ns": mtime_ns, "mode": 0o644, "link": None,
            "sha256": sha(data) if digest == "" else digest}


def test_a_receive_of_one_change_stages_its_whole_tree_from_the_digest_alone(tmp_path: Path) -> None:
    """A resubmit that changed one file and deleted one sends those and the tree's digest; the
    receive stages the whole tree (the files it did not bring included), each file verified,
    and what another sync moved since the laptop planned is ``stale``."""
    root = str(tmp_path / "root")
    finish = stage.finisher(root, workspace.workspace_dir(root, "p"))
    first = {"a.py": b"a1", "b.py": b"b1", "old.txt": b"old"}
    entries = {rel: laptop_entry(data, 1, None) for rel, data in first.items()}
    done = workspace.receive(root, "p", sync_stream({"delete": [], "entries": entries}, first))
    assert done["written"] == 3
    base = done["generation"]

    tree = {"a.py": [sha(b"a2"), None], "b.py": [sha(b"b1"), None]}  # a.py edited, old.txt deleted, b.py as it was
    control = {"delete": ["old.txt"], "base": base, "changed": {"a.py": laptop_entry(b"a2", 2, sha(b"a2"))},
               "stage": {"token": "j-0", "digest": tree_digest(tree)}}
    done = workspace.receive(root, "p", sync_stream(control, {"a.py": b"a2"}), finish=finish)
    assert done["stage"] == {"staged": 2} and done["written"] == 1
    staged = tmp_path / "root" / "staged" / "j-0"
    assert sorted(p.name for p in staged.iterdir()) == ["a.py", "b.py"]
    assert (staged / "a.py").read_bytes() == b"a2" and (staged / "b.py").read_bytes() == b"b1"

    # planned from ``base`` too, but a sync since replaced b.py: not this laptop's tree
    tree = {"a.py": [sha(b"a2"), None], "b.py": [sha(b"b1"), None], "c.py": [None, None]}
    control = {"delete": ["old.txt"], "base": base, "changed": {"c.py": laptop_entry(b"c1", 3, None)},
               "stage": {"token": "j-1", "digest": tree_digest(tree)}}
    workspace.receive(root, "p", sync_stream({"delete": [], "base": done["generation"],
                                              "changed": {"b.py": laptop_entry(b"b2", 4, None)}}, {"b.py": b"b2"}))
    done = workspace.receive(root, "p", sync_stream(control, {"c.py": b"c1"}), finish=finish)
    assert done["stage"] == {"stale": True} and not (tmp_path / "root" / "staged" / "j-1").exists()
    tree["c.py"] = [sha(b"c1"), None]  # the laptop's next round: the tree itself, c.py by what it sent
    control = {"delete": [], "base": done["generation"], "changed": {}, "stage": {"token": "j-1", "tree": tree}}
    done = workspace.receive(root, "p", sync_stream(control, {}), finish=finish)
    assert done["stage"] == {"differ": ["b.py"]}  # sent again in the round after


@pytest.mark.parametrize("how", ["cut mid-file", "refused mid-stream"])
def test_a_receive_that_fails_midway_releases_the_workspaces_lease(tmp_path: Path, how: str) -> None:
    """The receive's lease is released in a ``finally``: neither a stream cut off inside a file
    nor an error the receive raises itself leaves the workspace locked or its holder record
    behind; the next receive takes the lease at once."""
    root = str(tmp_path / "root")
    files = {"a.py": b"a1", "b.bin": os.urandom(200_000)}
    entries = {rel: laptop_entry(data, 1) for rel, data in files.items()}
    if how == "cut mid-file":
        whole = sync_stream({"delete": [], "entries": entries}, files).getvalue()
        stream = io.BytesIO(whole[:len(whole) // 2])  # inside b.bin's bytes
        said = "the sync stream broke off"
    else:
        stream = sync_stream({"delete": [], "entries": entries}, {"a.py": b"a1", "../outside": b"x"})
        said = "unsafe path"
    with pytest.raises(SyncError, match=said) as failed:  # its traceback (the receive's frames) kept alive here
        workspace.receive(root, "p", stream)
    lock = workspace.record_lock(root, "p")
    assert lease.holder(lock) is None and not os.path.exists(lock + ".holder"), failed.value
    assert (tmp_path / "root" / "workspace" / "p" / "a.py").read_bytes() == b"a1"  # what arrived is kept
    held = lease.acquire(lock, "receive p", max_wait_s=0)
    held.release()

"""Sync under ordinary mishaps, against `local` and the loopback sshd: paths that change
type, files that change while they are sent, and what is skipped and why."""

from __future__ import annotations

import gc
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import RemoteError
from orchestrator.helper.remote import Remote
from orchestrator.sync import selection
from orchestrator.sync import send as transfer
from remote_payload.contract.jobfolder import sha256_file, temp_name
from tests.support.orch import REPO, run_sync


def server_view(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a file's content, a symlink's target, or 'dir'."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = path.read_text()
    return out


def laptop_view(ws: Path) -> dict[str, str]:
    return {k: v for k, v in server_view(ws).items()}


def workspace_on(tmp_path: Path, ws: Path) -> Path:
    return tmp_path / "remote" / "workspace" / selection.project_name(ws)


def make(ws: Path, files: dict[str, str]) -> None:
    for rel, content in files.items():
        path = ws / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if content.startswith("-> "):
            path.symlink_to(content[3:])
        else:
            path.write_text(content)


def clear(ws: Path) -> None:
    for child in ws.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


TYPE_CHANGES = {
    "file becomes a folder": ({"x": "file"}, {"x/y": "inside"}),
    "folder becomes a file": ({"x/y": "inside", "x/z/w": "deeper"}, {"x": "file"}),
    "deep file becomes a folder": ({"a/b/c": "c", "a/b2": "b2"}, {"a/b/c/d/e": "e", "a/b2": "b2"}),
    "folder becomes a symlink": ({"d/a": "a", "src/s": "s"}, {"d": "-> src", "src/s": "s"}),
    "symlink becomes a folder": ({"d": "-> src", "src/s": "s"}, {"d/a": "a", "src/s": "s"}),
    "file becomes a symlink to a folder": ({"x": "file", "src/s": "s"}, {"x": "-> src", "src/s": "s"}),
}


@pytest.mark.parametrize("change", list(TYPE_CHANGES))
def test_a_path_that_changes_type_syncs_both_ways(remote: Remote, tmp_path: Path, change: str) -> None:
    ws = tmp_path / "proj"
    ws.mkdir()
    before, after = TYPE_CHANGES[change]
    make(ws, before)
    run_sync(remote, ws)
    assert server_view(workspace_on(tmp_path, ws)) == laptop_view(ws)
    clear(ws)
    make(ws, after)
    run_sync(remote, ws)
    assert server_view(workspace_on(tmp_path, ws)) == laptop_view(ws)
    clear(ws)
    make(ws, before)  # and back again
    plan, _ = run_sync(remote, ws)
    assert server_view(workspace_on(tmp_path, ws)) == laptop_view(ws)
    assert run_sync(remote, ws)[0].noop  # settled: nothing more to do


def test_a_server_file_orch_did_not_sync_is_never_removed_to_make_way(remote: Remote, tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    make(ws, {"a.py": "a"})
    run_sync(remote, ws)
    server = workspace_on(tmp_path, ws)
    (server / "notes").write_text("made on the server")
    make(ws, {"notes/n.txt": "from the laptop"})
    with pytest.raises(RemoteError, match="notes is a file on the server that orch did not sync"):
        run_sync(remote, ws)
    assert (server / "notes").read_text() == "made on the server"


def test_whatever_stands_at_a_files_temporary_name_is_replaced_never_written_through(
        remote: Remote, tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    make(ws, {"a.py": "a"})
    run_sync(remote, ws)
    server = workspace_on(tmp_path, ws)
    outside = tmp_path / "outside.txt"
    outside.write_text("not orch's")
    (server / temp_name("b.py")).symlink_to(outside)  # planted, or left by a crash
    (server / "sub").mkdir()
    (server / "sub" / temp_name("c.py")).write_text("a stale temporary")
    make(ws, {"b.py": "b", "sub/c.py": "c"})
    run_sync(remote, ws)
    assert outside.read_text() == "not orch's"
    assert server_view(server) == laptop_view(ws) == {"a.py": "a", "b.py": "b", "sub": "dir", "sub/c.py": "c"}
    assert run_sync(remote, ws)[0].noop


def test_a_file_rewritten_while_it_is_sent_is_sent_again_and_the_record_tells_the_truth(
        remote: Remote, tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    make(ws, {"a.txt": "first", "b.txt": "old b", "gone.txt": "soon deleted"})
    project = selection.project_name(ws)
    state = remote.call("hello", project=project)["sync"]
    plan = selection.plan_sync(ws, selection.select_files(ws, []), state, False)
    assert plan.send == ["a.txt", "b.txt", "gone.txt"]
    (ws / "gone.txt").unlink()
    rewritten = []

    def rewrite_b(_: int) -> None:  # called after a.txt went out: b.txt changes before it is read
        if not rewritten:
            (ws / "b.txt").write_text("new b, longer than before")
            rewritten.append(True)

    transfer.send(remote, project, ws, plan, progress=rewrite_b)
    server = workspace_on(tmp_path, ws)
    assert server_view(server) == {"a.txt": "first", "b.txt": "new b, longer than before"}
    record = remote.call("hello", project=project)["sync"]["files"]
    for rel in ("a.txt", "b.txt"):
        assert record[rel]["sha256"] == sha256_file(str(server / rel))
    assert "gone.txt" not in record
    assert run_sync(remote, ws)[0].noop


def test_a_file_that_shrinks_mid_read_is_padded_not_a_broken_stream() -> None:
    reader = transfer._HashingReader(io.BytesIO(b"abc"), 6)
    assert reader.read(4) + reader.read(10) == b"abc\0\0\0" and reader.short and reader.read(1) == b""


def test_a_stream_that_breaks_raises_once_and_its_buffered_bytes_go_nowhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tar goes through a 1 MiB buffer: when the stream breaks, the writer raises the
    link's error, and what the buffer still holds is never written after it (neither by a
    later flush nor when the buffer is collected, which would print "Exception ignored")."""
    ws = tmp_path / "proj"
    make(ws, {f"f{i}.txt": "x" * 5000 for i in range(400)})
    plan = selection.plan_sync(ws, selection.select_files(ws, []), {}, False)

    class Breaks:
        """A process whose stdin breaks after 1 MiB."""
        def __init__(self) -> None:
            self.got, self.after_break = 0, 0

        def write(self, data: bytes) -> None:
            if self.got >= 1 << 20:
                self.after_break += 1
                raise ConnectionResetError("the link dropped")
            self.got += len(data)

        def close_stdin(self) -> None:
            raise AssertionError("a broken stream is never closed as if complete")

    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    proc = Breaks()
    with pytest.raises(ConnectionResetError):
        transfer._write_stream(proc, ws, plan, None)
    gc.collect()
    assert proc.got >= 1 << 20 and proc.after_break == 1 and unraisable == []


def test_symlinks_to_folders_are_synced_as_links_and_outside_targets_are_named(tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    make(ws, {"src/a.py": "a", "lib": "-> src", "data": "-> /mnt/datasets/big"})
    files = selection.select_files(ws, [])
    assert files["lib"].link == "src" and files["data"].link == "/mnt/datasets/big" and "lib/a.py" not in files
    warnings = selection.warnings_for(files, selection.Skipped())
    assert any("data -> /mnt/datasets/big" in w and "outside the workspace" in w for w in warnings)


AS_USER = """
import json, sys
from pathlib import Path
from orchestrator.sync import selection as sync
from orchestrator.errors import UsageError
skipped = sync.Skipped()
try:
    files = sync.select_files(Path(sys.argv[1]), [], skipped)
    print(json.dumps({"files": sorted(files), "warnings": sync.warnings_for(files, skipped)}))
except UsageError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def run_without_root_powers(ws: Path) -> dict:
    """Select files as root without the power to read what its modes forbid (the tests run
    as root, which otherwise reads everything): a user who cannot read some files."""
    out = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search", sys.executable, "-c",
                          AS_USER, str(ws)], capture_output=True, text=True,
                         env={"PYTHONPATH": str(REPO), "PATH": os.environ["PATH"]}, check=True)
    return json.loads(out.stdout)


@pytest.mark.root  # setpriv drops capabilities only root holds
def test_unreadable_folders_are_named_and_an_unreadable_file_stops_the_sync(tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    make(ws, {"train.py": "t", "private/key": "k", "fifo-dir/x": "x"})
    (ws / "private").chmod(0o000)
    os.mkfifo(ws / "fifo-dir" / "pipe")
    try:
        result = run_without_root_powers(ws)
        assert result["files"] == ["fifo-dir/x", "train.py"]
        assert any("cannot be read: private/ (Permission denied)" in w for w in result["warnings"])
        assert any("not regular files" in w and "fifo-dir/pipe" in w for w in result["warnings"])
        (ws / "private").chmod(0o755)
        (ws / "private" / "key").chmod(0o000)
        result = run_without_root_powers(ws)
        assert "cannot read" in result["error"] and "private/key" in result["error"] and ".orchignore" in result["error"]
    finally:
        (ws / "private").chmod(0o755)

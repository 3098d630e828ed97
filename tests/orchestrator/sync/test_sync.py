"""Workspace sync against the loopback sshd and `local`: selection, diffs, deletes, modes,
remote edits, warnings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.helper.remote import Remote
from orchestrator.sync import selection
from tests.support.orch import run_sync, tree


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    ws = tmp_path / "proj"
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "src" / "pkg" / "a.py").write_text("a = 1\n")
    (ws / "train.sh").write_text("#!/bin/sh\necho hi\n")
    (ws / "train.sh").chmod(0o755)
    (ws / "data" / "raw").mkdir(parents=True)
    (ws / "data" / "raw" / "big.bin").write_bytes(os.urandom(1000))
    (ws / "data" / "keep.txt").write_text("keep\n")
    (ws / "build").mkdir()
    (ws / "build" / "x.o").write_text("obj")
    (ws / "notes.tmp").write_text("tmp")
    (ws / ".git").mkdir()
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (ws / ".gitignore").write_text("build/\n*.tmp\n")
    (ws / ".orchignore").write_text("data/raw/\n")
    return ws


def test_selection_follows_gitignore_orchignore_and_exclude(ws: Path) -> None:
    chosen = set(selection.select_files(ws, ["data/keep.txt"]))
    assert chosen == {".gitignore", ".orchignore", "src/pkg/a.py", "train.sh"}


def test_first_sync_copies_the_selection_with_modes(remote: Remote, ws: Path, tmp_path: Path) -> None:
    plan, summary = run_sync(remote, ws)
    dest = tmp_path / "remote" / "workspace" / selection.project_name(ws)
    assert tree(dest) == {k: v for k, v in tree(ws).items() if k in set(selection.select_files(ws, []))}
    assert summary["written"] == len(plan.send) == 5
    assert os.stat(dest / "train.sh").st_mode & 0o777 == 0o700  # its owner's bits only: never other users'
    assert os.stat(dest / "src" / "pkg" / "a.py").st_mode & 0o777 == 0o600
    assert not list(dest.rglob(".orch-tmp-*")) and not (dest / ".git").exists()


def test_no_change_moves_no_data_and_one_change_moves_one_file(remote: Remote, ws: Path, tmp_path: Path) -> None:
    run_sync(remote, ws)
    plan, summary = run_sync(remote, ws)
    assert plan.send == [] and plan.noop and summary["bytes"] == 0
    os.utime(ws / "train.sh")  # touched, same content: re-recorded, not re-sent
    plan, summary = run_sync(remote, ws)
    assert plan.send == [] and not plan.noop and summary["bytes"] == 0
    (ws / "src" / "pkg" / "a.py").write_text("a = 2\n")
    plan, summary = run_sync(remote, ws)
    assert plan.send == ["src/pkg/a.py"] and summary["written"] == 1
    assert (tmp_path / "remote" / "workspace" / selection.project_name(ws) / "src" / "pkg" / "a.py").read_text() == "a = 2\n"


def test_deletes_only_what_orch_synced(remote: Remote, ws: Path, tmp_path: Path) -> None:
    run_sync(remote, ws)
    dest = tmp_path / "remote" / "workspace" / selection.project_name(ws)
    (dest / "made-on-server.txt").write_text("mine\n")
    (ws / "train.sh").unlink()
    plan, summary = run_sync(remote, ws)
    assert plan.delete == ["train.sh"] and summary["deleted"] == 1
    assert not (dest / "train.sh").exists() and (dest / "made-on-server.txt").read_text() == "mine\n"


def test_files_edited_on_the_server_are_not_overwritten(remote: Remote, ws: Path, tmp_path: Path) -> None:
    run_sync(remote, ws)
    dest = tmp_path / "remote" / "workspace" / selection.project_name(ws) / "src" / "pkg" / "a.py"
    dest.write_text("edited in VSCode on the server\n")
    (ws / "src" / "pkg" / "a.py").write_text("a = 3\n")
    with pytest.raises(UsageError, match="changed on the server.*src/pkg/a.py"):
        run_sync(remote, ws)
    assert dest.read_text() == "edited in VSCode on the server\n"
    run_sync(remote, ws, force=True)
    assert dest.read_text() == "a = 3\n"


def test_a_file_deleted_on_the_server_is_restored(remote: Remote, ws: Path, tmp_path: Path) -> None:
    run_sync(remote, ws)
    dest = tmp_path / "remote" / "workspace" / selection.project_name(ws) / "train.sh"
    dest.unlink()
    plan, _ = run_sync(remote, ws)
    assert plan.send == ["train.sh"] and dest.read_text() == "#!/bin/sh\necho hi\n"


def test_secrets_and_size_are_warned_about(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (".env", "server.pem", "id_ed25519"):
        (ws / name).write_text("secret")
    monkeypatch.setenv("ORCH_LARGE_WORKSPACE_MB", "0")
    warnings = selection.warnings_for(selection.select_files(ws, []))
    assert ".env" in warnings[0] and "server.pem" in warnings[0] and "id_ed25519" in warnings[0]
    assert "the workspace is" in warnings[1] and ".orchignore" in warnings[1]

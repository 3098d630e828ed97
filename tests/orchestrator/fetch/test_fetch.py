"""Fetch treats the server's manifest as untrusted and never leaves a partial file final."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.orch import Orch, write_job

MAKE = """\
import os, pathlib
out = pathlib.Path(os.environ["ORCH_JOB_DIR"]) / "outputs"
out.mkdir(exist_ok=True)
(out / "model.bin").write_bytes(os.urandom(3_000_000))
os.symlink("/etc/passwd", out / "link-out")
"""


@pytest.fixture
def finished(orch: Orch, host: str) -> str:
    spec = write_job(orch.cwd, "out", host, ["python", "make.py"])
    (orch.cwd / "ws" / "make.py").write_text(MAKE)
    return json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]


def test_fetch_skips_symlinks_the_server_made(orch: Orch, finished: str) -> None:
    orch("fetch", finished)
    local = orch.cwd / "runs" / finished / "outputs"
    assert (local / "model.bin").stat().st_size == 3_000_000
    assert not (local / "link-out").exists()


def test_a_refetch_trusts_files_it_verified_and_rehashes_edited_ones(orch: Orch, finished: str) -> None:
    """A fetched file keeps its verified hash on the laptop (size + mtime, rsync's quick
    check): a refetch moves nothing; an edit (new mtime) is noticed and the file fetched again."""
    orch("fetch", finished)
    local = orch.cwd / "runs" / finished / "outputs" / "model.bin"
    assert ": 0 fetched (0.0 MB)" in orch("fetch", finished).stdout
    data = bytearray(local.read_bytes())
    data[0] ^= 0xFF
    local.write_bytes(bytes(data))  # same size, another content, a new mtime
    assert ": 1 fetched (2.9 MB)" in orch("fetch", finished).stdout
    assert local.read_bytes() == (orch.job_dir(finished) / "outputs" / "model.bin").read_bytes()


def test_fetch_resumes_from_a_part_file(orch: Orch, finished: str) -> None:
    remote = orch.job_dir(finished) / "outputs" / "model.bin"
    part = orch.cwd / "runs" / finished / "outputs" / "model.bin.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(remote.read_bytes()[:1_000_000])
    out = orch("fetch", finished)
    assert "(2.0 MB)" in out.stdout or "(1.9 MB)" in out.stdout  # only the rest of model.bin moved, + small logs
    assert (part.parent / "model.bin").read_bytes() == remote.read_bytes() and not part.exists()


def test_a_corrupt_part_file_is_discarded_not_renamed(orch: Orch, finished: str) -> None:
    part = orch.cwd / "runs" / finished / "outputs" / "model.bin.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(b"\0" * 1000)
    out = orch("fetch", finished, check=4)
    assert "size or sha256 differs from the manifest" in out.stderr and not (part.parent / "model.bin").exists() and not part.exists()
    orch("fetch", finished)
    assert (part.parent / "model.bin").stat().st_size == 3_000_000


BAD_PATHS = ["../evil", "/tmp/orch-evil", "outputs/../../evil", "", "a//b"]


def test_fetch_refuses_paths_outside_destination(orch: Orch, finished: str, tmp_path: Path) -> None:
    manifest_path = orch.job_dir(finished) / "manifest.json"
    original = manifest_path.read_text()
    for bad_path in BAD_PATHS:
        manifest = json.loads(original)
        manifest["files"].append({"path": bad_path, "size": 4, "sha256": "0" * 64, "mtime_ns": 0})
        manifest_path.write_text(json.dumps(manifest))
        out = orch("fetch", finished, check=4)
        assert "refusing manifest path" in out.stderr and "\x1b" not in out.stderr, bad_path
        written = [p.name for p in (orch.cwd / "runs" / finished).rglob("*")]
        assert written == [".orch-run"], bad_path  # nothing written at all but orch's marker
    assert not Path("/tmp/orch-evil").exists() and not list(tmp_path.rglob("evil"))


def test_fetch_refuses_a_destination_symlink_leading_out(orch: Orch, finished: str, tmp_path: Path) -> None:
    dest = orch.cwd / "runs" / finished
    dest.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (dest / "outputs").symlink_to(outside)
    out = orch("fetch", finished, check=4)
    assert "resolves outside" in out.stderr and list(outside.iterdir()) == []


def test_a_name_with_control_characters_is_skipped_and_named_not_written(orch: Orch, finished: str) -> None:
    manifest_path = orch.job_dir(finished) / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"].append({"path": "outputs/\x1b[2Jx", "size": 4, "sha256": "0" * 64, "mtime_ns": 0})
    manifest_path.write_text(json.dumps(manifest))
    out = orch("fetch", finished)
    assert "not fetched, names with control characters: 'outputs/\\x1b[2Jx'" in out.stderr and "\x1b" not in out.stderr
    local = orch.cwd / "runs" / finished / "outputs"
    assert (local / "model.bin").is_file() and [p.name for p in local.iterdir() if "2J" in p.name] == []

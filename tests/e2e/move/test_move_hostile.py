"""A move's receiving end treats what arrives as untrusted (issue 14): paths that would leave
the staging folder are refused, a file whose bytes do not match its sha256 never takes its
final name, a part file continues only from its own size, and adopt refuses an incomplete
staging folder. Against `local` and the loopback sshd (real helper sessions)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from orchestrator.errors import RemoteError
from orchestrator.helper.remote import Remote


def entry(path: str, data: bytes) -> dict:
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "mtime_ns": 1_700_000_000 * 10**9}


def send(remote: Remote, job: str, expected: list[dict], parts: list[tuple[str, int, bytes]]) -> dict:
    proc = remote.start("move_receive", job=job, files=expected)
    for path, offset, data in parts:
        proc.write((json.dumps({"path": path, "offset": offset, "size": len(data)}) + "\n").encode() + data)
    proc.write(b'{"end": true}\n')
    proc.close_stdin()
    return remote.finish(proc, "receiving")


@pytest.mark.parametrize("bad", ["../escape", "/etc/passwd", "a/../../b", "x\nnewline", ".move-journal", "ok.orch-part"])
def test_paths_leaving_the_staging_folder_are_refused(remote: Remote, bad: str, tmp_path: Path) -> None:
    with pytest.raises(RemoteError, match="refusing the path"):
        send(remote, "job-1", [entry(bad, b"x")], [(bad, 0, b"x")])
    assert not (tmp_path / "escape").exists()


def test_damaged_bytes_never_take_the_final_name_and_a_cut_file_continues(remote: Remote, tmp_path: Path) -> None:
    stage = Path(remote.host.root) / "jobs" / ".move-job-2"
    good = b"0123456789" * 1000
    with pytest.raises(RemoteError, match="arrived damaged"):
        send(remote, "job-2", [entry("code/a.bin", good)], [("code/a.bin", 0, good[:-1] + b"!")])
    assert not (stage / "code" / "a.bin").exists() and not (stage / "code" / "a.bin.orch-part").exists()

    assert send(remote, "job-2", [entry("code/a.bin", good)], [("code/a.bin", 0, good[:4000])])["written"] == 0
    have = remote.call("move_have", job="job-2")
    assert have["parts"] == {"code/a.bin": 4000} and have["files"] == {} and not have["exists"]
    with pytest.raises(RemoteError, match="only 4000 are here"):
        send(remote, "job-2", [entry("code/a.bin", good)], [("code/a.bin", 5000, good[5000:])])
    assert send(remote, "job-2", [entry("code/a.bin", good)], [("code/a.bin", 4000, good[4000:])])["written"] == 1
    assert (stage / "code" / "a.bin").read_bytes() == good
    assert (stage / "code" / "a.bin").stat().st_mtime_ns == 1_700_000_000 * 10**9
    assert remote.call("move_have", job="job-2")["files"] == {"code/a.bin": hashlib.sha256(good).hexdigest()}


def test_adopt_refuses_a_staging_folder_that_lacks_a_file(remote: Remote) -> None:
    send(remote, "job-3", [entry("code/a.py", b"print(1)\n")], [("code/a.py", 0, b"print(1)\n")])
    job = {"job_id": "job-3", "nodes": [], "job_dir": str(Path(remote.host.root) / "jobs" / "job-3")}
    missing = entry("code/b.py", b"print(2)\n")
    with pytest.raises(RemoteError, match="1 file\\(s\\) have not arrived"):
        remote.call("adopt", request={"job": job}, files=[missing, entry("code/a.py", b"print(1)\n")], moved={})
    assert not (Path(remote.host.root) / "jobs" / "job-3").exists()

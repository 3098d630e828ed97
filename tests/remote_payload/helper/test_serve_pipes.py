"""The helper widens the pipes it is served through (``serve.widen_pipes``; Linux, as every
server is): a real helper process on pipes, as sshd or the local transport starts it."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

from remote_payload.contract import protocol
from remote_payload.helper.serve import F_SETPIPE_SZ, PIPE_BYTES

F_GETPIPE_SZ = F_SETPIPE_SZ + 1
REPO = Path(__file__).resolve().parents[3]


def helper(root: Path, stdin: object) -> subprocess.Popen[bytes]:
    code = "import sys; from remote_payload.helper.serve import main; sys.exit(main(sys.argv[1], sys.argv[1], ['serve']))"
    return subprocess.Popen([sys.executable, "-c", code, str(root)], cwd=REPO, stdin=stdin, stdout=subprocess.PIPE)


def test_the_helper_gives_its_stdin_and_stdout_pipes_a_mebibyte(tmp_path: Path) -> None:
    proc = helper(tmp_path, subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    assert fcntl.fcntl(proc.stdin.fileno(), F_GETPIPE_SZ) < PIPE_BYTES  # Linux's default (64 KiB), before
    assert proc.stdout.read(len(protocol.MAGIC)) == protocol.MAGIC  # widened before this was written
    assert fcntl.fcntl(proc.stdin.fileno(), F_GETPIPE_SZ) == PIPE_BYTES
    assert fcntl.fcntl(proc.stdout.fileno(), F_GETPIPE_SZ) == PIPE_BYTES
    proc.stdin.close()
    assert proc.wait(timeout=60) == 0


def test_a_helper_on_something_else_than_a_pipe_serves_as_before(tmp_path: Path) -> None:
    with open("/dev/null", "rb") as nothing:  # not a pipe: its size stays, the session ends at once
        proc = helper(tmp_path, nothing)
        assert proc.stdout is not None
        assert proc.stdout.read() == protocol.MAGIC
        assert proc.wait(timeout=60) == 0

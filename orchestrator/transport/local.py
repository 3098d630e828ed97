"""``LocalTransport``: the built-in ``local`` host, a subprocess on this machine."""

from __future__ import annotations

import subprocess
import threading
from typing import Sequence

from orchestrator.transport import shell
from orchestrator.transport.base import Process, Transport


class LocalProcess(Process):
    def __init__(self, argv: Sequence[str]) -> None:
        self.command = shell.join(argv)
        self._popen = subprocess.Popen(
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self._err: list[bytes] = []
        self._err_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._err_thread.start()

    def _drain_stderr(self) -> None:
        assert self._popen.stderr is not None
        while chunk := self._popen.stderr.read1(65536):
            self._err.append(chunk)

    def write(self, data: bytes) -> None:
        assert self._popen.stdin is not None
        self._popen.stdin.write(data)
        self._popen.stdin.flush()

    def close_stdin(self) -> None:
        assert self._popen.stdin is not None
        try:
            self._popen.stdin.close()
        except (BrokenPipeError, ValueError):
            pass

    def read(self, size: int = 65536) -> bytes:
        assert self._popen.stdout is not None
        return self._popen.stdout.read1(size)

    def wait(self) -> int:
        code = self._popen.wait()
        self._err_thread.join()
        return code

    def kill(self) -> None:
        if self._popen.poll() is None:
            self._popen.kill()

    @property
    def stderr(self) -> bytes:
        return b"".join(self._err)


class LocalTransport(Transport):
    """Runs argv directly (no shell) as a child of this process."""

    def __init__(self, name: str = "local") -> None:
        self.name = name
        self._started: list[LocalProcess] = []

    def start(self, argv: Sequence[str], *, warm: bool = False) -> Process:
        proc = LocalProcess(argv)
        self._started = [p for p in self._started if p._popen.poll() is None] + [proc]
        return proc

    def close(self) -> None:
        """EOF on the stdin of every command still running (a helper session ends)."""
        for proc in self._started:
            proc.close_stdin()
        self._started = []

"""What the ``orch tunnel`` tests share (tests/e2e/tunnel, tests/e2e/provider): an HTTP server to
reach, and an orch command running in the background with its output read as it comes."""

from __future__ import annotations

import functools
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO

from tests.support.orch import Orch
from tests.support.poll import wait_until

URL = re.compile(r"^(http://127\.0\.0\.1:(\d+)) -> ", re.M)


class Served:
    """A folder served over HTTP on 127.0.0.1 (the box is this machine): ``port``, and
    ``token``, the text of its ``token.txt``."""

    def __init__(self, folder: Path, token: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "token.txt").write_text(token)
        self.token = token
        handler = functools.partial(_Quiet, directory=str(folder))
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def get(url: str) -> str | None:
    """The body at ``url``, or None when it cannot be had now."""
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.read().decode()
    except OSError:
        return None


class Running:
    """``orch ARGS`` in the background; its stdout and stderr collected as they come."""

    def __init__(self, orch: Orch, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *args], cwd=orch.cwd,
                                     env={**orch.env, **(env or {})}, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._read, args=(stream, into), daemon=True).start()

    @staticmethod
    def _read(stream: IO[str] | None, into: list[str]) -> None:
        assert stream is not None
        for line in stream:
            into.append(line)

    @property
    def stdout(self) -> str:
        return "".join(self.out)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def said(self, text: str, timeout: float = 120) -> str:
        """Wait until stderr holds ``text`` (fails at once if orch exited)."""
        def seen() -> bool:
            if text in self.stderr:
                return True
            if self.proc.poll() is not None:
                raise AssertionError(f"orch exited {self.proc.returncode} before saying {text!r}:\n"
                                     f"{self.stdout}\n{self.stderr}")
            return False
        wait_until(seen, what=f"orch to say {text!r}", timeout=timeout, detail=lambda: self.stderr)
        return self.stderr

    def said_times(self, text: str, times: int, timeout: float = 120) -> str:
        """Wait until stderr holds ``text`` ``times`` times."""
        wait_until(lambda: self.stderr.count(text) >= times or self.proc.poll() is not None,
                   what=f"orch to say {text!r} {times} times", timeout=timeout, detail=lambda: self.stderr)
        assert self.stderr.count(text) >= times, self.stdout + self.stderr
        return self.stderr

    def urls(self, count: int = 1, timeout: float = 120) -> list[tuple[str, int]]:
        """The printed local URLs with their ports."""
        def printed() -> list[tuple[str, int]] | None:
            if self.proc.poll() is not None and len(URL.findall(self.stdout)) < count:
                raise AssertionError(f"orch exited {self.proc.returncode}:\n{self.stdout}\n{self.stderr}")
            found = [(m[0], int(m[1])) for m in URL.findall(self.stdout)]
            return found if len(found) >= count else None
        return wait_until(printed, what="the local URL", timeout=timeout, detail=lambda: self.stderr)

    def interrupt(self) -> int:
        """Ctrl-C; the exit code."""
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def fetched(url: str, token: str, timeout: float = 120) -> str:
    """Wait until ``url`` serves ``token`` (a tunnel that connects again takes a moment)."""
    return wait_until(lambda: (get(url) or "") == token and token, what=f"{url} to serve the token", timeout=timeout)

"""A local HTTP server standing in for a chat webhook, and a recording `notify-send`."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest


@dataclass
class Hook:
    """Records every request; answers with ``status`` and ``answer`` after ``delay`` seconds."""

    port: int = 0
    requests: list[dict] = field(default_factory=list)
    status: int = 200
    answer: bytes = b'{"ok": true}'
    delay: float = 0.0

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
def hook() -> Iterator[Hook]:
    state = Hook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            state.requests.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(body)})
            time.sleep(state.delay)
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(state.answer)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield state
    server.shutdown()


@pytest.fixture
def desktop(tmp_path: Path) -> tuple[Path, Path]:
    """(a folder to put first on PATH, the file its `notify-send` appends each call's argv to:
    one line per call, each argument followed by a tab)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "notify-calls.jsonl"
    bin_dir.mkdir()
    tool = bin_dir / "notify-send"
    tool.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\t" "$a"; done >> {calls}\necho >> {calls}\n')
    tool.chmod(0o755)
    return bin_dir, calls

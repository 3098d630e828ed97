"""A local HTTP server that answers what a test says (real HTTP, no sshd): the provider
adapters' tests read odd, hostile or failing answers through it."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest


@pytest.fixture(scope="module")
def api() -> Iterator[dict[str, Any]]:
    """A server whose answer is ``state["answer"](method, path, headers) -> (status, body)``;
    requests are kept in ``state["seen"]``."""
    state: dict[str, Any] = {"answer": None, "seen": []}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            state["seen"].append((self.command, self.path, dict(self.headers), body))
            status, raw = state["answer"](self.command, self.path, dict(self.headers))
            try:
                self.send_response(status)
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (the timeout test)

        do_GET = do_POST = do_PUT = do_DELETE = _any

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()

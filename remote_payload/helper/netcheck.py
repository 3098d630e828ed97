"""Multi-node preflight on the server: a free port, a short listener, a TCP connect check.

Standard library only. The ``listen`` request (serve.py) binds with ``bind``, says so, and
accepts (and closes) connections with ``accept_until`` until the laptop ends it or time is up.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Any, Dict


def free_port() -> Dict[str, Any]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return {"port": s.getsockname()[1], "hostname": socket.gethostname()}


def bind(port: int) -> socket.socket:
    """A TCP listener on every address at ``port`` (OSError when it cannot be had)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", port))
        server.listen(16)
    except OSError:
        server.close()
        raise
    return server


def accept_until(server: socket.socket, stop: threading.Event, deadline: float) -> None:
    """Accept (and close) connections until ``stop`` is set or ``deadline`` passes; then
    close the listener."""
    try:
        while not stop.is_set() and time.time() < deadline:
            ready, _, _ = select.select([server], [], [], 0.2)
            if ready:
                conn, _ = server.accept()
                conn.close()
    finally:
        server.close()


def tcp_check(host: str, port: int, timeout: float = 5.0) -> Dict[str, Any]:
    started = time.time()
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        return {"ok": False, "reason": str(exc) or type(exc).__name__}
    return {"ok": True, "seconds": round(time.time() - started, 4)}

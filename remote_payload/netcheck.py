"""Multi-node preflight on the server: a free port, a short listener, a TCP connect check.

Standard library only. ``listen`` prints one JSON line when it is bound, then accepts (and
closes) connections until its stdin reaches EOF or ``seconds`` pass.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import time
from typing import Any, Dict


def free_port() -> Dict[str, Any]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return {"port": s.getsockname()[1], "hostname": socket.gethostname()}


def listen(port: int, seconds: float) -> int:
    try:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("", port))
        server.listen(16)
    except OSError as exc:
        sys.stdout.write(json.dumps({"error": "cannot listen on port %d: %s" % (port, exc)}) + "\n")
        sys.stdout.flush()
        return 4
    sys.stdout.write(json.dumps({"ready": True, "port": port}) + "\n")
    sys.stdout.flush()
    deadline = time.time() + seconds
    stdin = sys.stdin.buffer
    while time.time() < deadline:
        ready, _, _ = select.select([server, stdin], [], [], 0.5)
        if server in ready:
            conn, _ = server.accept()
            conn.close()
        if stdin in ready and not stdin.read1(1):  # type: ignore[attr-defined]
            break
    server.close()
    return 0


def tcp_check(host: str, port: int, timeout: float = 5.0) -> Dict[str, Any]:
    started = time.time()
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        return {"ok": False, "error": str(exc) or type(exc).__name__}
    return {"ok": True, "seconds": round(time.time() - started, 4)}

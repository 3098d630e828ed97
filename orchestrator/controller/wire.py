"""What the controller and the commands on its host say to each other over its socket.

One JSON object per line each way: a request ``{"op": ..., ...}`` and one reply object. Replies
that failed carry ``{"error": "..."}``. Standard library only (``host.py`` uses it before it
knows the laptop package's dependencies are there).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

MAX_LINE = 16 << 20


def ask(sock_path: Path, request: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """Send ``request`` to the controller at ``sock_path``; its reply. ``OSError`` when none
    listens there; ``ValueError`` for a reply that is not one JSON object."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(sock_path))
        sock.sendall(json.dumps(request).encode() + b"\n")
        line = read_line(sock)
    if line is None:
        raise ConnectionResetError("the controller closed the connection without a reply")
    value = json.loads(line)
    if not isinstance(value, dict):
        raise ValueError("the controller's reply is not a JSON object")
    return value


def read_line(sock: socket.socket) -> bytes | None:
    """One line (without its newline) from ``sock``; None at EOF before a whole line."""
    buf = bytearray()
    while b"\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
        if len(buf) > MAX_LINE:
            raise ValueError("line too long")
    return bytes(buf[: buf.index(b"\n")])

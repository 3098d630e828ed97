"""What a connection holder and its clients share: the wire format and where holders live.

Wire format: the client sends one JSON line (``{"argv": [...], "warm": bool}``, or
``{"op": "ping"|"stop"}`` answered by one JSON line), then both sides speak frames: 1 byte
kind, 4 byte big-endian length, payload.

The holder answers ``S`` (started; its payload a JSON object saying what the holder did for
it: ``spare`` taken, ``waited_ms`` for one being started, the spare's ``age_ms`` or the new
channel's ``open_ms``, shown by ``ORCH_TRACE``) or ``X`` (not started: the caller may connect directly),
then streams ``O``/``E`` (stdout/stderr), ``A`` (stdin bytes written: a 1 MiB window), and
ends with ``C`` (exit code) or ``L`` (the command was lost, with why). The client sends ``I``
(stdin), ``F`` (stdin EOF) and ``K`` (kill).

A forward (``orch tunnel``): the client sends ``{"op": "forward", "address": str, "port": int}``;
the holder answers ``S`` and from then on the socket carries the forwarded bytes as they are,
both ways, or ``R`` (the server could not connect there: its words) or ``X`` (not opened: the
caller may forward on a direct connection).

A holder lives at ``<folder>/<key>.sock`` (with its ``.lock`` and ``.log``) in a private
folder; the key names the connection it keeps. Nothing here imports paramiko: a command that
finds its holder never pays for it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import __version__, settings
from orchestrator.home import laptop_id, lock_free, orch_home, private_folder, take_lock
from orchestrator.hosts.inventory import Host
from remote_payload.contract.bytequeue import ByteQueue

SOCK_MAX = 100          # bytes of a socket path (sun_path: 104 on macOS, 108 on Linux, with NUL)
MAX_FRAME = 1 << 20


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + struct.pack(">I", len(payload)) + payload


def send_frame(sock: socket.socket, kind: bytes, payload: bytes | memoryview) -> None:
    """``sock.sendall(frame(kind, payload))`` without copying ``payload`` into the frame: the
    header and the payload go out as they are (``sendmsg``), however the kernel splits them."""
    data = memoryview(payload).cast("B")
    parts = [memoryview(kind + struct.pack(">I", len(data))), data]
    while parts:
        sent = sock.sendmsg(parts)
        while parts and sent >= len(parts[0]):
            sent -= len(parts.pop(0))
        if parts and sent:
            parts[0] = parts[0][sent:]


class Reader:
    """Buffered reads of lines and frames from a stream socket; ``None`` at EOF."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, ByteQueue()

    def _fill(self, want: int = 1 << 16) -> bool:
        chunk = self.sock.recv(max(want, 1 << 16))
        self.buf.put(chunk)
        return bool(chunk)

    def line(self, limit: int = MAX_FRAME) -> bytes | None:
        while (line := self.buf.line(limit)) is None:
            if len(self.buf) > limit or not self._fill():
                return None
        return line

    def frame(self) -> tuple[bytes, bytes] | None:
        """The next frame; ``None`` at EOF; ``ValueError`` for a frame over ``MAX_FRAME``."""
        while len(self.buf) < 5:
            if not self._fill():
                return None
        head = self.buf.take(5)
        kind, length = head[:1], struct.unpack(">I", head[1:5])[0]
        if length > MAX_FRAME:
            raise ValueError("oversized frame")
        while len(self.buf) < length:
            if not self._fill(length - len(self.buf)):
                return None
        return kind, self.buf.take(length)


@dataclass(frozen=True)
class Place:
    """Where one holder lives: ``<folder>/<key>.sock`` with its ``.lock`` and ``.log``."""

    key: str
    folder: Path

    @property
    def sock(self) -> Path:
        return self.folder / f"{self.key}.sock"

    @property
    def lock(self) -> Path:
        return self.folder / f"{self.key}.lock"

    @property
    def log(self) -> Path:
        return self.folder / f"{self.key}.log"


def holder_key(host: Host, home: Path) -> str | None:
    """16 hex naming the connection a holder keeps: ORCH_HOME, user, address, port, pinned key,
    identity file, password variable, orch's version and the keepalive period. The password
    itself only enters as an HMAC keyed with this laptop's secret id, so a command with another
    password never reuses a connection made with the old one. ``None``: the password variable
    is unset (the direct connection says so)."""
    secret = None
    if host.password_env:
        value = os.environ.get(host.password_env)
        if value is None:
            return None
        secret = hmac.new(laptop_id().encode(), b"orch-holder\0" + value.encode("utf-8", "surrogateescape"),
                          "sha256").hexdigest()
    fields = [str(home), host.user, host.address, host.port, host.host_key, host.identity_file, host.password_env,
              secret, __version__, f"{settings.KEEPALIVE.seconds():g}"]
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:16]


def holder_folders(home: Path) -> list[Path]:
    """Where sockets may be: ``ORCH_HOME/holders``, and the temp folder for long paths."""
    return [home / "holders", Path(tempfile.gettempdir()) / f"orch-{os.getuid()}"]


def place(host: Host) -> Place | None:
    """The holder's place for ``host``, or ``None`` (no holder: connect directly) when its
    folder is not private or even the temp folder's path is too long for a socket."""
    home = orch_home().resolve()
    key = holder_key(host, home)
    if key is None:
        return None
    for folder in holder_folders(home):
        if len(os.fsencode(folder / f"{key}.sock")) <= SOCK_MAX:
            return Place(key, folder) if private_folder(folder) else None
    return None


def connect(path: Path, timeout: float = 5.0) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(str(path))
    except BaseException:
        sock.close()
        raise
    return sock


def ask(path: Path, op: str, timeout: float = 5.0) -> dict[str, Any]:
    """One ``{"op": op}`` request; the holder's JSON answer. Raises ``OSError``/``ValueError``."""
    with connect(path, timeout) as sock:
        sock.sendall(json.dumps({"op": op}).encode() + b"\n")
        line = Reader(sock).line()
    if line is None:
        raise ConnectionResetError("the holder closed the connection")
    value = json.loads(line)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value

"""``HeldTransport``: commands through a host's connection holder (``orchestrator.holder.daemon``).

The holder keeps one SSH connection to a host warm behind a private Unix socket; every command
is one connection to that socket, speaking the wire format of ``orchestrator.holder.wire``.
Nothing here imports paramiko: a command that finds its holder never pays for it.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import threading
from pathlib import Path
from typing import Callable, Sequence

from orchestrator import settings, trace
from orchestrator.errors import HostError
from orchestrator.holder.wire import Reader, ask, connect, lock_free, place, send_frame
from orchestrator.hosts.inventory import Host
from orchestrator.transport import shell
from orchestrator.transport.base import ForwardRefused, Process, Stream, Transport
from remote_payload.contract.bytequeue import ByteQueue

WINDOW = 1 << 20        # stdin bytes in flight before ``write`` waits for the holder's acks
STDIN_FRAME = 1 << 18   # stdin bytes per frame: four in flight
OUT_BUFFER = 4 << 20    # stdout bytes kept for ``read`` before the reader stops taking more
REPLY_S = 60.0          # how long a client waits for the holder's S/X answer
VIA = " (through the connection holder)"


def enabled() -> bool:
    """``ORCH_HOLD=0`` turns connection holders off."""
    return settings.HOLD.on()


def reach(host: Host, fallback: Callable[[], Transport]) -> "HeldTransport | None":
    """A ``HeldTransport`` when a holder for ``host`` answers and its connection is up;
    otherwise ``None`` (a socket that refuses, left by a killed holder, is removed when no
    holder holds its lock). ``fallback`` opens the direct connection when a start finds the
    holder gone. Never raises."""
    try:
        where = place(host)
        if where is None:
            return None
        try:
            info = ask(where.sock, "ping")
        except ConnectionRefusedError:
            def remove() -> None:
                if stat.S_ISSOCK(os.lstat(where.sock).st_mode):
                    where.sock.unlink()
            lock_free(where.lock, remove)
            return None
        return HeldTransport(host, where.sock, fallback) if info.get("active") is True else None
    except (OSError, ValueError):
        return None


def held_words(payload: bytes) -> str:
    """What the holder's ``S`` frame says it did for a command, for the trace."""
    try:
        took = json.loads(payload)
        if took.get("spare"):
            return (f"a spare helper started {took['age_ms'] / 1000:.1f} s before"
                    + (f" (waited {took['waited_ms']:.0f} ms for it to start)" if took["waited_ms"] >= 1 else ""))
        return (f"a new channel opened in {took.get('open_ms', 0):.0f} ms"
                + (f" (after {took['waited_ms']:.0f} ms waiting for a spare)" if took["waited_ms"] >= 1 else ""))
    except (ValueError, TypeError, KeyError, AttributeError):
        return "started"


def first_frame(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """The holder's answer to a forward, read byte-exact (a ``Reader`` would buffer the
    forwarded bytes that follow it); ``None`` at EOF."""
    def exact(n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    head = exact(5)
    if head is None:
        return None
    length = struct.unpack(">I", head[1:5])[0]
    if length > 1 << 16:
        raise ValueError("oversized answer")
    payload = exact(length)
    return None if payload is None else (head[:1], payload)


class HeldProcess(Process):
    """A command started through the holder: the same contract as ``SSHProcess``."""

    def __init__(self, transport: "HeldTransport", sock: socket.socket, reader: Reader, command: str) -> None:
        self.command, self._t, self._sock, self._reader = command, transport, sock, reader
        self._cond = threading.Condition()
        self._send_lock = threading.Lock()
        self._out = ByteQueue()
        self._inflight = 0
        self._err: list[bytes] = []
        self._code: int | None = None
        self._lost: str | None = None
        self._timeout: float | None = None
        self._killed = False
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        """Sort the holder's frames until the end frame (or the holder is gone)."""
        code, lost = None, ": the connection holder ended"
        try:
            while (got := self._reader.frame()) is not None:
                kind, payload = got
                with self._cond:
                    if kind == b"O":
                        self._out.put(payload)
                        self._cond.notify_all()
                        while len(self._out) > OUT_BUFFER and not self._killed:
                            self._cond.wait()
                    elif kind == b"E":
                        self._err.append(payload)
                    elif kind == b"A":
                        self._inflight -= struct.unpack(">I", payload)[0]
                        self._cond.notify_all()
                    elif kind == b"C":
                        code, lost = struct.unpack(">i", payload)[0], None
                        break
                    elif kind == b"L":
                        lost = payload.decode("utf-8", "replace")
                        break
        except (OSError, ValueError, struct.error):
            pass
        with self._cond:
            self._code, self._lost = code, "" if self._killed and code is None else lost
            self._cond.notify_all()
        self._shutdown()

    def _shutdown(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _done(self) -> bool:
        return self._code is not None or self._lost is not None

    def lost(self, detail: str | None = None) -> HostError:
        return self._t.error(f" was lost{detail or self._lost or ''}")

    def _send(self, kind: bytes, payload: bytes | memoryview = b"") -> None:
        with self._send_lock:
            send_frame(self._sock, kind, payload)

    def write(self, data: bytes | memoryview) -> None:
        """Send ``data`` as stdin (bytes-like; used only until this returns)."""
        view = memoryview(data).cast("B")
        while view:
            chunk = view[:STDIN_FRAME]
            with self._cond:
                while self._inflight + len(chunk) > WINDOW and not self._done() and not self._killed:
                    self._cond.wait()
                if self._done() or self._killed:
                    raise self.lost(": Socket is closed")
                self._inflight += len(chunk)
            try:
                self._send(b"I", chunk)
            except OSError as exc:
                raise self.lost(f": {exc}") from None
            view = view[len(chunk):]

    def close_stdin(self) -> None:
        try:
            self._send(b"F")
        except OSError:
            pass

    def read(self, size: int = 65536) -> bytes:
        """Stdout bytes; ``b""`` once the command exited and its output is read. A holder
        or link that drops raises ``HostError``; ``settimeout`` bounds the wait for data."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._out or self._done(), self._timeout):
                raise socket.timeout("timed out")
            if not self._out:
                if self._code is not None:
                    return b""
                raise self.lost()
            chunk = self._out.take(size)
            self._cond.notify_all()
            return chunk

    def settimeout(self, seconds: float | None) -> None:
        """Make ``read`` raise ``socket.timeout`` after ``seconds`` without data."""
        self._timeout = seconds

    def wait(self) -> int:
        self._timeout = None
        with self._cond:
            self._cond.wait_for(self._done)
            if self._code is None:
                raise self.lost()
            return self._code

    def kill(self) -> None:
        with self._cond:
            self._killed = True
            self._cond.notify_all()
        try:
            self._send(b"K")
        except OSError:
            pass
        self._shutdown()

    @property
    def stderr(self) -> bytes:
        return b"".join(self._err)


class HeldTransport(Transport):
    """Starts commands through a holder; when it is gone (or says it cannot start one),
    through a direct connection made by ``fallback``, kept for the rest of this transport."""

    def __init__(self, host: Host, sock: Path, fallback: Callable[[], Transport]) -> None:
        self.host, self.name, self.sock = host, host.name, sock
        self._fallback = fallback
        self._direct: Transport | None = None
        self._procs: list[HeldProcess] = []
        self._lock = threading.Lock()

    def error(self, what: str) -> HostError:
        """``what`` (`` was lost: ...``) happened to the connection to this host."""
        return HostError(f"connection to {self.host.name} ({self.host.target}){what}{VIA}")

    def _request(self, argv: Sequence[str], warm: bool) -> HeldProcess | None:
        """The started command, or ``None`` when the holder did not start it."""
        command = shell.join(argv)
        try:
            sock = connect(self.sock)
        except OSError:
            return None
        try:
            sock.settimeout(REPLY_S)
            sock.sendall(json.dumps({"argv": list(argv), "warm": warm}).encode() + b"\n")
            reader = Reader(sock)
            got = reader.frame()
        except socket.timeout:
            sock.close()
            raise self.error(": no answer") from None
        except (OSError, ValueError):
            got = None  # the holder went away before it started anything
        if got is None or got[0] != b"S":
            sock.close()
            return None
        if trace.ON:
            trace.mark("holder", f"{self.name}: {held_words(got[1])}")
        sock.settimeout(None)
        return HeldProcess(self, sock, reader, command)

    def start(self, argv: Sequence[str], *, warm: bool = False) -> Process:
        """``argv`` through the holder (a warm spare of the same argv when ``warm``)."""
        if self._direct is None:
            proc = self._request(argv, warm)
            if proc is not None:
                with self._lock:
                    self._procs = [p for p in self._procs if not p._done()] + [proc]
                return proc
            with self._lock:
                if self._direct is None:
                    self._direct = self._fallback()
        return self._direct.start(argv, warm=warm)

    def forward(self, address: str, port: int) -> Stream:
        """A stream to ``address:port`` through the holder's connection (the socket itself,
        once the holder said ``S``); through the direct connection when the holder is gone or
        cannot open one. ``ForwardRefused`` with the server's words."""
        if self._direct is None:
            sock = None
            try:
                sock = connect(self.sock)
                sock.settimeout(REPLY_S)
                sock.sendall(json.dumps({"op": "forward", "address": address, "port": port}).encode() + b"\n")
                got = first_frame(sock)
            except socket.timeout:
                if sock is not None:
                    sock.close()
                raise self.error(": no answer") from None
            except (OSError, ValueError):
                got = None
            if got is not None and got[0] == b"S":
                assert sock is not None
                sock.settimeout(None)
                return sock
            if sock is not None:
                sock.close()
            if got is not None and got[0] == b"R":
                raise ForwardRefused(got[1].decode("utf-8", "replace"))
            with self._lock:
                if self._direct is None:
                    self._direct = self._fallback()
        return self._direct.forward(address, port)

    def alive(self) -> bool:
        """The direct connection's state once one was made, else whether the holder answers
        and says its connection is up."""
        if self._direct is not None:
            return self._direct.alive()
        try:
            return ask(self.sock, "ping").get("active") is True
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        """Stop every command still running through the holder (as closing an SSH connection
        would) and close the direct connection, if one was made."""
        with self._lock:
            procs, self._procs = self._procs, []
            direct, self._direct = self._direct, None
        for proc in procs:
            if not proc._done():
                proc.kill()
        if direct is not None:
            direct.close()

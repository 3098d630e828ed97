"""The SSH side of a connection holder (``orchestrator.holder.daemon``): commands on its connection.

Each client's command is one exec channel whose output becomes frames (``orchestrator.holder.wire``);
a few started spares are kept for argv lists asked for ``warm`` (their output buffered, none lost).
A client's forward (``orch tunnel``) is one ``direct-tcpip`` channel spliced to its socket.
"""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time
from collections import deque
from typing import Callable, Sequence

import paramiko

from orchestrator import settings
from orchestrator.errors import OrchError
from orchestrator.holder.wire import MAX_FRAME, Reader, frame
from orchestrator.transport import shell
from orchestrator.transport.base import ForwardRefused
from orchestrator.transport.splice import splice
from orchestrator.transport.ssh import RECV_BYTES, SSHTransport, keepalive

# Commands that follow each other at once (a submit, a resubmit, another) each find one started
# at least a command earlier: a spare taken while others are kept is replaced when its command ends.
SPARES_PER_ARGV = 3
MAX_SPARES = 4  # each is a session: OpenSSH allows 10 per connection by default
SPARE_BUFFER = 1 << 20  # output a spare keeps before it stops reading (the SSH window holds the rest)
TICK_S = 0.2  # how soon the accept loop notices a reason to stop
SSH_ERRORS = (OSError, EOFError, paramiko.SSHException)
log = logging.getLogger("orch.holder")


class Channel:
    """One exec channel. Its output becomes frames, kept while no client is attached (a
    spare; at most ``SPARE_BUFFER`` bytes, then it stops reading) and sent once one is."""

    def __init__(self, chan: paramiko.Channel, argv: Sequence[str]) -> None:
        self.chan, self.argv, self.born = chan, tuple(argv), time.monotonic()
        self._cond = threading.Condition()
        self._kept: list[bytes] = []
        self._kept_bytes, self._pumps = 0, 2
        self._send: Callable[[bytes], None] | None = None
        self.ended = threading.Event()  # stdout and stderr both at EOF
        for recv, kind in ((chan.recv, b"O"), (chan.recv_stderr, b"E")):
            threading.Thread(target=self._pump, args=(recv, kind), daemon=True).start()

    def _pump(self, recv: Callable[[int], bytes], kind: bytes) -> None:
        try:
            while data := recv(RECV_BYTES):  # all paramiko holds: a partial read moves the rest
                for start in range(0, len(data), MAX_FRAME):
                    self._emit(frame(kind, data[start:start + MAX_FRAME]))
        except SSH_ERRORS:  # the client is gone, or the channel broke
            self.close()
        with self._cond:
            self._pumps -= 1
            if not self._pumps:
                self.ended.set()

    def _emit(self, data: bytes) -> None:
        with self._cond:
            while self._send is None and self._kept_bytes >= SPARE_BUFFER and not self.chan.closed:
                self._cond.wait(TICK_S)
            send = self._send
            if send is None:
                self._kept.append(data)
                self._kept_bytes += len(data)
                return
        send(data)

    def attach(self, send: Callable[[bytes], None]) -> None:
        """Send what was kept, then everything as it comes, through ``send``."""
        with self._cond:
            for data in self._kept:
                send(data)
            self._kept, self._kept_bytes, self._send = [], 0, send
            self._cond.notify_all()

    def alive(self) -> bool:
        return not (self.ended.is_set() or self.chan.closed or self.chan.exit_status_ready())

    def close(self) -> None:
        try:
            self.chan.close()
        except SSH_ERRORS:
            pass


class Stdin:
    """Writes a client's stdin frames to the channel on a thread of its own, so a kill frame
    is read while a write waits for the server; each write is acknowledged (``A``)."""

    def __init__(self, ch: Channel, send: Callable[[bytes], None]) -> None:
        self.ch, self.send = ch, send
        self.cond = threading.Condition()
        self.queue: deque[bytes] = deque()
        self.eof = self.stopped = False
        threading.Thread(target=self._run, daemon=True).start()

    def put(self, data: bytes | None) -> None:
        """Queue ``data``; ``None`` is EOF."""
        with self.cond:
            if data is None:
                self.eof = True
            else:
                self.queue.append(data)
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    def _run(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.queue or self.eof or self.stopped)
                if self.stopped:
                    return
                data = self.queue.popleft() if self.queue else None
            try:
                if data is None:
                    self.ch.chan.shutdown_write()
                    return
                self.ch.chan.sendall(data)
                self.send(frame(b"A", struct.pack(">I", len(data))))
            except SSH_ERRORS:
                return


class Commands:
    """Commands on the held connection, one per client, and the spares; the holder is
    stopping once ``reason`` is set. ``lock`` guards the counts and sets here."""

    def __init__(self, ssh: SSHTransport) -> None:
        self.ssh = ssh
        self.connect_s, self.spare_s = settings.CONNECT_TIMEOUT.seconds(), settings.hold_spare_s()
        self.probe_s = min(self.connect_s, 5.0)  # a keepalive round trip slower: the spare is not handed out
        self.lock = threading.Lock()
        self.spare_cv = threading.Condition(self.lock)  # a spare was started (or failed to)
        self.served = 0
        self.busy: set[Channel] = set()
        self.spares: dict[tuple[str, ...], deque[Channel]] = {}  # oldest first
        self.starting: set[tuple[str, ...]] = set()  # one at a time per argv
        self.reason: str | None = None

    def answers(self) -> bool:
        """Whether the server answers a keepalive within ``probe_s``: a spare started on a
        connection that has since frozen (a stalled link, a suspended laptop's NAT entry gone)
        must not be handed out, or its first request waits for the stall detector. One round
        trip: far less than the helper start a spare saves; a fresh channel's open is one too."""
        transport = self.ssh.client.get_transport()
        if transport is None or not transport.is_active():
            return False
        return keepalive(transport, self.probe_s) and transport.is_active()

    def connected(self) -> bool:
        transport = self.ssh.client.get_transport()
        return transport is not None and transport.is_active()

    def open(self, argv: Sequence[str]) -> Channel:
        """``argv`` started on a new channel (quoted by ``shell.join``, as SSHTransport does)."""
        transport = self.ssh.client.get_transport()
        if transport is None or not transport.is_active():
            raise self.ssh.lost(None)
        chan = transport.open_session(timeout=self.connect_s)
        try:
            chan.exec_command(shell.join(argv))
        except BaseException:
            chan.close()
            raise
        return Channel(chan, argv)

    def execute(self, conn: socket.socket, reader: Reader, argv: list[str], warm: bool) -> None:
        """One command for one client: S (or X), its output, and C or L at the end."""
        send_lock = threading.Lock()

        def send(data: bytes) -> None:
            with send_lock:
                conn.sendall(data)

        t0 = time.monotonic()
        ch = self.take_spare(argv) if warm else None
        if ch is not None and not self.answers():
            log.info("the connection did not answer a keepalive in %g s: the spare is not handed out", self.probe_s)
            ch.close()
            send(frame(b"X", f"the held connection did not answer within {self.probe_s:g} s".encode()))
            return
        took = {"spare": ch is not None, "waited_ms": round((time.monotonic() - t0) * 1000, 1)}
        if ch is not None:
            took["age_ms"] = round((time.monotonic() - ch.born) * 1000, 1)
        else:
            try:
                if self.reason:
                    raise OSError("the connection holder is stopping")
                t1 = time.monotonic()
                ch = self.open(argv)
                took["open_ms"] = round((time.monotonic() - t1) * 1000, 1)
            except (OrchError, *SSH_ERRORS) as exc:
                log.info("could not start a command (the client connects directly): %r", exc)
                send(frame(b"X", str(exc).encode()))
                return
        with self.lock:
            self.busy.add(ch)
            self.served += 1
            # Another spare is kept: the next command finds it, and this one's replacement starts
            # when this command ends: a helper starting beside a sync (a login shell and a Python,
            # ~0.15 CPU-s) competed with it wherever the server is busy or is this machine.
            later = warm and bool(self.spares.get(tuple(argv)))
        try:
            send(frame(b"S", json.dumps(took).encode()))  # what the holder did for it: ORCH_TRACE shows it
            if warm and not later:
                self.refill(argv)
            ch.attach(send)
            stdin = Stdin(ch, send)
            taker = threading.Thread(target=self.take_input, args=(reader, ch, stdin), daemon=True)
            taker.start()
            ch.ended.wait()
            stdin.stop()
            send(self.final(ch))
            conn.shutdown(socket.SHUT_RDWR)
            taker.join(timeout=5)
        finally:
            ch.close()
            with self.lock:
                self.busy.discard(ch)
            if later:
                self.refill(argv)

    def forward(self, conn: socket.socket, address: str, port: int) -> None:
        """One forward for one client: ``S`` then the raw bytes both ways until both ends
        closed; ``R`` with the server's words when it could not connect there; ``X`` when the
        holder cannot open a channel (the client then forwards on a direct connection)."""
        try:
            if self.reason:
                raise OSError("the connection holder is stopping")
            chan = self.ssh.forward(address, port)
        except ForwardRefused as exc:
            conn.sendall(frame(b"R", str(exc).encode()))
            return
        except (OrchError, *SSH_ERRORS) as exc:
            log.info("could not open a forward (the client connects directly): %r", exc)
            conn.sendall(frame(b"X", str(exc).encode()))
            return
        with self.lock:
            self.served += 1
        conn.sendall(frame(b"S", b"{}"))
        splice(conn, chan)

    @staticmethod
    def take_input(reader: Reader, ch: Channel, stdin: Stdin) -> None:
        """The client's frames: stdin, its EOF, kill. A client that goes away kills too."""
        try:
            while (got := reader.frame()) is not None and got[0] != b"K":
                if got[0] in (b"I", b"F"):
                    stdin.put(got[1] if got[0] == b"I" else None)
        except (OSError, ValueError):
            pass
        stdin.stop()
        ch.close()

    def final(self, ch: Channel) -> bytes:
        code = ch.chan.recv_exit_status()
        if code != -1:
            return frame(b"C", struct.pack(">i", code))
        detail = (": the connection holder stopped" if self.reason else
                  f": no answer for {3 * self.ssh.keepalive_s:g} s (stalled)" if self.ssh.stalled else "")
        return frame(b"L", detail.encode())

    def take_spare(self, argv: Sequence[str]) -> Channel | None:
        """The oldest running spare of ``argv`` (when there is none, one being started is
        waited for), or ``None``."""
        key = tuple(argv)
        dead: list[Channel] = []
        with self.spare_cv:
            self.spare_cv.wait_for(lambda: self.spares.get(key) or key not in self.starting, self.connect_s)
            ready = self.spares.get(key) or deque()
            ch = None
            while ready and ch is None:
                ch = ready.popleft()
                if not ch.alive():
                    dead.append(ch)
                    ch = None
            if not ready:
                self.spares.pop(key, None)
        for gone in dead:
            gone.close()
        return ch

    def spare_count(self) -> int:
        """Spares kept, all argv lists together (call under ``lock``)."""
        return sum(len(q) for q in self.spares.values())

    def refill(self, argv: Sequence[str]) -> None:
        """Start the next spare for ``argv`` in the background: one at a time, until
        ``SPARES_PER_ARGV`` are kept (``MAX_SPARES`` in all)."""
        key = tuple(argv)
        with self.lock:
            if self.reason or key in self.starting or len(self.spares.get(key, ())) >= SPARES_PER_ARGV or \
                    self.spare_count() + len(self.starting) >= MAX_SPARES:
                return
            self.starting.add(key)
        threading.Thread(target=self._start_spare, args=(key,), daemon=True).start()

    def _start_spare(self, key: tuple[str, ...]) -> None:
        ch = None
        try:
            ch = self.open(key)
        except (OrchError, *SSH_ERRORS) as exc:
            log.info("could not start a spare: %s", exc)
        with self.spare_cv:
            self.starting.discard(key)
            kept = ch is not None and not self.reason
            if kept:
                self.spares.setdefault(key, deque()).append(ch)
                ch = None
            self.spare_cv.notify_all()
        if ch is not None:
            ch.close()
        if kept:
            self.refill(key)  # the next one, once this one is started

    def expire_spares(self) -> None:
        now = time.monotonic()
        gone: list[Channel] = []
        with self.lock:
            for key in list(self.spares):
                kept = deque(ch for ch in self.spares[key] if now - ch.born < self.spare_s and ch.alive())
                gone += [ch for ch in self.spares[key] if ch not in kept]
                if kept:
                    self.spares[key] = kept
                else:
                    del self.spares[key]
        for ch in gone:
            ch.close()

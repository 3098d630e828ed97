"""The laptop's end of one helper session on a host (``remote_payload/contract/protocol.py``).

``Session`` wraps a started ``serve`` process: it skips whatever a login shell printed before
the helper's ``MAGIC``, then speaks frames. ``StreamCall`` is one request that streams bytes
(in, out or both) and looks like a ``Process`` to its caller: ``write`` sends data frames,
``close_stdin`` the end frame, ``read`` returns the data the server streams and ``b""`` once
its reply arrived (``reply`` holds it). Every byte from the server is untrusted: a garbled
frame is a ``ProtocolError``.
"""

from __future__ import annotations

import json
import socket
import threading
from typing import Any, Callable

from orchestrator.testhooks import armed, pause
from orchestrator.transport.base import Process
from remote_payload.contract import protocol
from remote_payload.contract.bytequeue import ByteQueue
from remote_payload.contract.protocol import DATA, END, REPLY, REQUEST, ProtocolError, frame

MAX_PREAMBLE = 1 << 20  # what a login shell may print before the helper starts
READ_BYTES = 1 << 20  # the server's data frames (helper/serve.py ``Output``) and the holder's frames


class HelperEnded(Exception):
    """The helper process ended (or never started) where a frame was expected."""


class Session:
    """One running ``serve`` helper; requests go through it one at a time."""

    def __init__(self, proc: Process) -> None:
        self.proc, self.buf, self.broken = proc, ByteQueue(), False

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (``protocol.read_frame`` loops); ``b""`` when the helper ended.
        Asks the transport for a data frame's worth at least (``READ_BYTES``), so the chunks a
        holder relays are taken whole, never cut and copied."""
        if not self.buf:
            self.buf.put(self.proc.read(max(n, READ_BYTES)))
        return self.buf.take(n)

    def wait_ready(self) -> bytes:
        """Read up to the helper's MAGIC; ``HelperEnded`` (with what was printed) when the
        process ended first."""
        seen = b""
        while protocol.MAGIC not in seen:
            chunk = self.proc.read(1 << 16)
            if not chunk:
                raise HelperEnded(seen)
            seen += chunk
            if len(seen) > MAX_PREAMBLE:
                self.broken = True
                raise ProtocolError("over 1 MiB of output before orch's helper started (a chatty login profile?)")
        before, _, rest = seen.partition(protocol.MAGIC)
        self.buf.put(rest)
        return before

    def send(self, kind: bytes, payload: bytes = b"") -> None:
        self._write(frame(kind, payload))

    def _write(self, data: bytes) -> None:
        """Write to the helper; one that has ended (a closed pipe) is ``HelperEnded``, so its
        exit code and stderr explain it, never a bare BrokenPipeError."""
        try:
            self.proc.write(data)
        except (BrokenPipeError, ConnectionResetError) as exc:
            self.broken = True
            raise HelperEnded(f"orch's helper stopped reading ({exc.strerror or exc})".encode()) from None

    def request(self, op: str, args: dict[str, Any]) -> None:
        """Send request ``op``. Tests: pause point ``<op>-half-sent`` holds the frame half
        written, ``<op>-sent`` after it (``testhooks.py``)."""
        data = frame(REQUEST, json.dumps({"op": op, "args": args}).encode("utf-8"))
        if armed(f"{op}-half-sent"):
            self._write(data[:len(data) // 2])
            pause(f"{op}-half-sent")
            data = data[len(data) // 2:]
        self._write(data)
        pause(f"{op}-sent")

    def next_frame(self) -> tuple[bytes, bytes]:
        try:
            got = protocol.read_frame(self)
        except ProtocolError:
            self.broken = True
            raise
        if got is None:
            self.broken = True
            raise HelperEnded(b"")
        return got

    def reply(self, op: str, payload: bytes) -> dict[str, Any]:
        """A reply frame's payload checked against ``op``'s row."""
        try:
            value = json.loads(payload.decode("utf-8"))
        except ValueError:
            raise ProtocolError(f"the reply to {op} is not JSON") from None
        return protocol.check_reply(op, value)

    def kill(self) -> None:
        self.broken = True
        try:
            self.proc.kill()
        except OSError:
            pass

    def close(self) -> None:
        """End the helper: EOF on its stdin (it exits after the request in hand)."""
        self.broken = True
        try:
            self.proc.close_stdin()
        except OSError:
            pass


class Deadline:
    """``with Deadline(seconds, session):`` kills the session if the block is still running
    after ``seconds`` (None: never); ``fired`` says afterwards whether it did."""

    def __init__(self, seconds: float | None, session: Session) -> None:
        self.fired = threading.Event()
        self.timer = None if seconds is None else threading.Timer(seconds, self._expire, args=(session,))

    def _expire(self, session: Session) -> None:
        self.fired.set()
        session.kill()

    def __enter__(self) -> "Deadline":
        if self.timer is not None:
            self.timer.daemon = True
            self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.timer is not None:
            self.timer.cancel()


class StreamCall(Process):
    """A streaming request on a session the caller holds until the reply arrives."""

    def __init__(self, session: Session, op: str, release: Callable[[Session], None],
                 broken: Callable[[str, Session, BaseException], Exception]) -> None:
        """``release`` takes the session back once the reply is in; ``broken`` turns a helper
        that ended or garbled its answer into the error to raise."""
        self.session, self.op, self._release, self._broken = session, op, release, broken
        self.command = f"{session.proc.command} ({op})"
        self.result: dict[str, Any] | None = None
        self._pending = ByteQueue()
        self._input_done = not protocol.REQUESTS[op].reads

    def write(self, data: bytes) -> None:
        try:
            for start in range(0, len(data), 1 << 20):
                self.session.send(DATA, data[start:start + (1 << 20)])
        except HelperEnded as exc:
            raise self._broken(self.op, self.session, exc) from None

    def close_stdin(self) -> None:
        if not self._input_done:
            self._input_done = True
            self.session.send(END)

    def read(self, size: int = 65536) -> bytes:
        """The next streamed bytes; ``b""`` once the reply is in. Raises ``HelperEnded`` or
        ``ProtocolError`` when the helper broke off."""
        while not self._pending and self.result is None:
            try:
                kind, payload = self.session.next_frame()
            except socket.timeout:
                self.session.broken = True  # maybe mid-frame: never reuse it
                raise
            except (HelperEnded, ProtocolError) as exc:
                raise self._broken(self.op, self.session, exc) from None
            if kind == DATA:
                self._pending.put(payload)
            elif kind == REPLY:
                try:
                    self.result = self.session.reply(self.op, payload)
                except ProtocolError as exc:
                    raise self._broken(self.op, self.session, exc) from None
                if not self._input_done:  # answered before our input ended (refused): this session is done
                    self.session.kill()
                self._release(self.session)
            else:
                raise self._broken(self.op, self.session, ProtocolError(f"a {kind!r} frame in the answer"))
        return self._pending.take(size)

    def wait(self) -> int:
        while self.read(1 << 20):
            pass
        assert self.result is not None
        return 4 if "error" in self.result else 0

    def kill(self) -> None:
        self.session.kill()

    def settimeout(self, seconds: float | None) -> None:
        """Make ``read`` raise ``socket.timeout`` after ``seconds`` without data (where the
        transport can)."""
        set_timeout = getattr(self.session.proc, "settimeout", None)
        if set_timeout is not None:
            set_timeout(seconds)

    @property
    def stderr(self) -> bytes:
        return self.session.proc.stderr


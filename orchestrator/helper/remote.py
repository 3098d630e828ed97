"""``Remote``: a host's helper as Python calls, over one ``Transport``.

Requests (``remote_payload/contract/protocol.py``) go through helper sessions: one ``serve`` process
started through the host's login shell (so conda's PATH and the profile's variables are there,
for the supervisor too) serves every request of this orch command; a second one is started only
while the first is busy (a stream in progress). Before a command's first request on a host,
the fences of jobs that moved away from it are acted on (``fence.py``). The payload is
installed on first use (one extra round trip per host and orch version). A failure the
helper reports becomes
``RemoteError`` (exit 4) naming the host and the request; a reply that does not match the
request's row is rejected the same way, never passed on. Every reply's server timestamps
arrive on the laptop's clock (``clock.py``: the offset measured from this host's replies).
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from typing import Any

from orchestrator import settings, trace
from orchestrator.errors import HostError, RemoteError, RootNotWritable
from orchestrator.helper import fence
from orchestrator.helper.clock import Offset, status_to_laptop, to_laptop
from orchestrator.helper.payload import BOOT, MISSING_EXIT, ROOT_EXIT, ROOT_MARKER, payload_hash, payload_tar
from orchestrator.helper.session import Deadline, HelperEnded, Session, StreamCall
from orchestrator.hosts.inventory import Host
from orchestrator.termtext import clean
from orchestrator.transport import shell
from orchestrator.transport.base import CommandFailed, Result, Transport
from remote_payload.contract import protocol
from remote_payload.contract.bytequeue import ByteQueue
from remote_payload.contract.protocol import REPLY, ProtocolError

# How the agent reports an OSError ("PermissionError: [Errno 13] Permission denied: '/x'"):
# permission denied, operation not permitted, read-only file system.
_WRITE_ERROR = re.compile(r"^(?:PermissionError|OSError): \[Errno (?:1|13|30)\] (?P<reason>[^:]+): '(?P<path>[^']*)'")


def helper_argv(host: Host, command: str = "serve") -> list[str]:
    """The argv of ``host``'s helper; on an SSH host through ``bash -l`` (``Remote.argv``; a
    connection holder keeps a spare of it: ``access.connect.open_transport``'s ``warm``)."""
    argv = [sys.executable if host.kind == "local" else host.python, "-c", BOOT, host.root, payload_hash(), command]
    return argv if host.kind == "local" else shell.login_argv(argv)


class Remote:
    """One host's helper. ``call`` for a request with a reply only; ``start`` + ``finish``
    for one that streams."""

    def __init__(self, host: Host, transport: Transport) -> None:
        self.host, self.transport = host, transport
        self.python = sys.executable if host.kind == "local" else host.python
        self.root_seen: str | None = None  # the expanded root, once ``hello`` reported it
        self.clock = Offset()  # the server's clock minus the laptop's, from this host's replies
        self._idle: list[Session] = []
        self._lock = threading.Lock()
        self._fenced = False  # this host's pending fences were acted on (``fence.settle_on``)
        self._fence_lock = threading.Lock()

    def argv(self, command: str = "serve") -> list[str]:
        """The helper's argv; on an SSH host through ``bash -l``."""
        return helper_argv(self.host, command)

    def install(self) -> None:
        """Send the payload. ``RootNotWritable`` (one line, no command) when the host's root
        cannot be created or written; ``CommandFailed`` for any other failure."""
        t0 = trace.since_start_ms()
        result = self.transport.run(self.argv("install"), input=payload_tar(), timeout=120)
        trace.mark("install", f"{self.host.name}: orch's helper sent in {trace.since_start_ms() - t0:.0f} ms")
        if result.exit_code == ROOT_EXIT:
            unwritable = root_not_writable(self.host, result.stderr)
            if unwritable is not None:
                raise unwritable
        if not result.ok:
            raise CommandFailed(result, f"installing orch's helper with {self.python}")

    # -- sessions ------------------------------------------------------------------------
    def _open(self) -> Session:
        """A ready helper session; installs the payload when the host lacks this version. A
        helper that has not started within ``ORCH_HELPER_START_S`` (a login profile that hangs) is stopped
        and named, never waited on forever."""
        start_s = settings.HELPER_START.seconds()
        for attempt in range(2):
            t0 = trace.since_start_ms()
            proc = self.transport.start(self.argv(), warm=attempt == 0)
            session = Session(proc)
            slow = Deadline(start_s, session)
            try:
                with slow:
                    session.wait_ready()
                trace.mark("helper start", f"{self.host.name}: ready in {trace.since_start_ms() - t0:.0f} ms")
                return session
            except (HelperEnded, HostError) as ended:
                if slow.fired.is_set():
                    raise RemoteError(
                        f"{self.host.name}: orch's helper did not start within {start_s:g} s: the login shell "
                        f"(bash -l, with ~/.bash_profile, ~/.bashrc) hangs or is very slow there; check it with "
                        f"`orch exec {self.host.name} -- true` or `orch ssh {self.host.name}`") from None
                if isinstance(ended, HostError):
                    raise
                code = proc.wait()
                if code == MISSING_EXIT and attempt == 0:
                    self.install()
                    continue
                result = Result(self.host.name, proc.command, code, ended.args[0], proc.stderr)
                if code == ROOT_EXIT:
                    unwritable = root_not_writable(self.host, proc.stderr)
                    if unwritable is not None:
                        raise unwritable from None
                raise CommandFailed(result, f"starting orch's helper with {self.python}") from None
            except ProtocolError as exc:
                session.kill()
                raise RemoteError(f"{self.host.name}: {exc}") from None
        raise AssertionError("unreachable")

    def _take(self) -> Session:
        with self._lock:
            while self._idle:
                session = self._idle.pop()
                if not session.broken:
                    return session
        return self._open()

    def _give(self, session: Session) -> None:
        if session.broken:
            return
        with self._lock:
            self._idle.append(session)

    def close(self) -> None:
        """End the idle helper sessions (the transport's close ends the rest)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for session in idle:
            session.close()

    # -- requests ------------------------------------------------------------------------
    def _settle_fences(self) -> None:
        """Before this command's first request here: stop and set aside the superseded
        attempts of jobs that moved away from this host (``orchestrator/helper/fence.py``).
        Other threads wait for it; the fence's own requests pass (the flag is set first)."""
        if self._fenced:
            return
        with self._fence_lock:
            if self._fenced:
                return
            self._fenced = True
            fence.settle_on(self)

    def call(self, op: str, *, timeout: float | None = 300, **args: Any) -> dict[str, Any]:
        """Run request ``op`` and return its checked reply. ``timeout``: seconds until the
        helper is stopped and ``RemoteError`` says the request did not answer."""
        if protocol.REQUESTS[op].reads or protocol.REQUESTS[op].writes:
            raise ValueError(f"{op} streams: use start() and finish()")
        checked = protocol.check_args(op, args)
        self._settle_fences()
        session = self._take()
        late = Deadline(timeout, session)
        try:
            with late:
                sent = time.time()
                session.request(op, checked)
                kind, payload = session.next_frame()
                arrived = time.time()
            if kind != REPLY:
                raise ProtocolError(f"a {kind!r} frame instead of the reply")
            value = session.reply(op, payload)
            self.clock.measure(sent, arrived, value)
            trace.mark(op, f"{self.host.name}: answered in {(arrived - sent) * 1000:.0f} ms")
        except (HelperEnded, ProtocolError, HostError) as exc:
            session.broken = True
            if late.fired.is_set():
                raise RemoteError(f"{self.host.name}: {op} did not answer within {timeout:g} s") from None
            raise self._broken(op, session, exc) from None
        self._give(session)
        return self._checked(op, value)

    def start(self, op: str, **args: Any) -> StreamCall:
        """Start streaming request ``op`` on a session of its own until its reply."""
        checked = protocol.check_args(op, args)
        self._settle_fences()
        session = self._take()
        try:
            session.request(op, checked)
        except HelperEnded as exc:
            raise self._broken(op, session, exc) from None
        return StreamCall(session, op, self._give, self._broken)

    def finish(self, call: StreamCall, what: str = "") -> dict[str, Any]:
        """Read a started request to its reply (discarding streamed bytes left) and return
        the checked reply."""
        call.wait()
        assert call.result is not None
        return self._checked(call.op, call.result, what)

    def _checked(self, op: str, value: dict[str, Any], what: str = "") -> dict[str, Any]:
        value.pop("clock", None)  # measured in ``call``; no caller sees it
        if "error" in value:
            raise self._agent_error(what or op, value["error"])
        if op == "hello":
            self.root_seen = value["root"].rstrip("/") or "/"
        return to_laptop(op, value, self.clock.correction)

    def laptop_status(self, status: Any) -> Any:
        """A job status this host sent outside a reply (a log's end frame) on the laptop's clock."""
        return status_to_laptop(status, self.clock.correction)

    def _broken(self, op: str, session: Session, exc: BaseException) -> Exception:
        """The error for a session that broke during ``op``: a lost link stays a
        ``HostError``; a helper that died or garbled its reply names the request."""
        if isinstance(exc, HostError):
            return exc
        if isinstance(exc, ProtocolError):
            session.kill()
            return RemoteError(f"{self.host.name}: orch's helper answered {op} with a malformed reply: {exc}")
        session.kill()
        code = session.proc.wait()
        return CommandFailed(Result(self.host.name, session.proc.command, code, b"", session.proc.stderr),
                             f"orch's helper (during {op})")

    def _agent_error(self, what: str, message: object) -> RemoteError:
        """The agent's ``{"error": ...}`` as an exception: a permission or read-only error on
        a path under the root that ``hello`` reported is ``RootNotWritable``."""
        message = clean(str(message))[:2000]
        match = _WRITE_ERROR.match(message)
        if match and self.root_seen is not None:
            path = match["path"]
            if path == self.root_seen or path.startswith(self.root_seen.rstrip("/") + "/"):
                return RootNotWritable(self.host.name, self.root_seen, clean(match["reason"]), self.host.root)
        return RemoteError(f"{self.host.name}: {what} failed: {message}")


def root_not_writable(host: Host, stderr: bytes) -> RootNotWritable | None:
    """BOOT's ``orch-root-unwritable<TAB>path<TAB>reason`` line (untrusted: cleaned and
    capped) as the one-line error; ``None`` when stderr holds no such line."""
    for line in stderr.decode("utf-8", "replace").splitlines():
        marker, _, rest = line.partition("\t")
        if marker == ROOT_MARKER:
            path, _, reason = rest.partition("\t")
            return RootNotWritable(host.name, clean(path)[:300] or host.root, clean(reason)[:200] or "unknown reason",
                                   host.root)
    return None


HEADER_MAX = 1 << 16  # bytes of one file header line in a ``send`` stream (a long path, escaped)


class FileStream:
    """Reads the agent's ``send`` stream: JSON header lines, each followed by raw bytes."""

    def __init__(self, proc: Any) -> None:
        self.proc, self.buf = proc, ByteQueue()

    def _fill(self) -> bool:
        chunk = self.proc.read(1 << 20)
        self.buf.put(chunk)
        return bool(chunk)

    def header(self) -> dict[str, Any]:
        while (line := self.buf.line(HEADER_MAX)) is None:
            if len(self.buf) > HEADER_MAX or not self._fill():
                err = self.proc.stderr.decode("utf-8", "replace").strip()[-400:] if hasattr(self.proc, "stderr") else ""
                raise RemoteError(f"the file stream broke off{': ' + err if err else ''}")
        try:
            value = json.loads(line)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise RemoteError("the file stream holds an unreadable header")
        return value

    def take(self, n: int) -> bytes:
        if not self.buf and not self._fill():
            raise RemoteError("the file stream broke off mid-file")
        return self.buf.take(n)

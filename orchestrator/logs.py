"""Print or follow a job's node log by byte offset.

Following never ends on a dropped connection: it reconnects with backoff and continues at
the exact byte it had reached. A stalled connection is noticed too: the server sends a
heartbeat frame while the log is quiet, and no frame for ``3 × heartbeat`` counts as a
lost connection. It ends when the job is terminal and the log is drained; the server's end
frame then carries the node's terminal status, so the end costs no further round trip.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
from typing import Any, Callable

from orchestrator import logcache
from orchestrator.connect import never, open_transport
from orchestrator.errors import HostError, RemoteError, UsageError
from orchestrator.hosts import Host, Inventory
from orchestrator.jobs import aggregate, nodes_of, parallel, probe
from orchestrator.registry import JobRecord, Registry
from orchestrator.remote import Remote
from orchestrator.session import StreamCall
from orchestrator.termtext import CleanDecoder, clean
from remote_payload.protocol import TERMINAL

MAX_BACKOFF_S = 30.0
MAX_REASON = 500  # characters of a server's reason printed at the end of a followed log
HEARTBEAT_S = float(os.environ.get("ORCH_LOG_HEARTBEAT_S", "5"))


def one_line(text: Any, limit: int = MAX_REASON) -> str:
    """Server text as one line of printable text: control characters dropped (``clean``),
    newlines, tabs and runs of spaces collapsed to one space, at most ``limit`` characters."""
    line = " ".join(clean(str(text)).split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def final_line(job_id: str, status: dict[str, Any]) -> str:
    """``JOB STATE[: reason]`` — what ``orch logs -f`` / ``submit --follow`` print last."""
    reason = one_line(status.get("reason") or "")
    return f"{job_id} {one_line(status.get('state'), 40)}" + (f": {reason}" if reason else "")


class _Frames:
    """Reads ``follow``'s frames; a silence longer than ``timeout`` is a lost connection."""

    def __init__(self, remote: Remote, proc: StreamCall, timeout: float) -> None:
        self.remote, self.proc, self.buf = remote, proc, b""
        if hasattr(proc, "settimeout"):
            proc.settimeout(timeout)

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            try:
                chunk = self.proc.read(max(65536, n - len(self.buf)))
            except socket.timeout:
                raise HostError("no data or heartbeat from the server: the connection stalled") from None
            if not chunk:  # the reply came before the end frame: it says why
                self.remote.finish(self.proc, "reading the log")
                raise RemoteError(f"{self.remote.host.name}: the log stream ended without its end frame")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def next(self) -> tuple[bytes, bytes]:
        head = self._exactly(5)
        kind, length = head[:1], struct.unpack(">I", head[1:])[0]
        if kind not in (b"D", b"H", b"E") or length > 1 << 20:
            raise RemoteError("the server's log stream is garbled")
        return kind, self._exactly(length)


def end_status(data: bytes) -> dict[str, Any] | None:
    """The terminal status an end frame carries, or None (empty, garbled, not terminal)."""
    try:
        status = json.loads(data.decode("utf-8")) if data else None
    except ValueError:
        return None
    ok = isinstance(status, dict) and status.get("state") in TERMINAL
    return status if ok else None


def follow_node(record: JobRecord, host: Host, inventory: Inventory, node: int, *, write: Callable[[str], None],
                say: Callable[[str], None], follow: bool, tail: int | None) -> dict[str, Any] | None:
    """One node's log through ``write`` until it ends (``follow``: the node is terminal);
    returns the node's terminal status when the end frame carried one."""
    decoder = CleanDecoder()
    offset: int | None = None if tail is not None else 0
    backoff = 0.5
    while True:
        try:
            with open_transport(host, inventory, never) as transport:
                remote = Remote(host, transport)
                if offset is None:
                    offset = remote.call("tail_offset", job=record.job_id, node=node, lines=tail)["offset"]
                proc = remote.start("follow", job=record.job_id, offset=offset, node=node, follow=follow,
                                    heartbeat=HEARTBEAT_S)
                frames = _Frames(remote, proc, 3 * HEARTBEAT_S)
                backoff = 0.5
                while True:
                    kind, data = frames.next()
                    if kind == b"E":
                        final = end_status(data)
                        break
                    if kind == b"D":
                        offset += len(data)
                        write(decoder.feed(data))
                remote.finish(proc, "reading the log")
                write(decoder.feed(b"", final=True))
                return final
        except HostError as exc:
            if not follow:
                raise
            say(f"{exc}; reconnecting in {backoff:.1f} s (Ctrl-C stops following, the job keeps running)")
            time.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)


class _Prefixed:
    """Whole lines only, each with ``[node i] ``, so nodes never interleave mid-line."""

    def __init__(self, prefix: str, write: Callable[[str], None], lock: threading.Lock) -> None:
        self.prefix, self.write, self.lock, self.rest = prefix, write, lock, ""

    def __call__(self, text: str) -> None:
        lines = (self.rest + text).split("\n")
        self.rest = lines.pop()
        if lines:
            with self.lock:
                self.write("".join(f"{self.prefix}{line}\n" for line in lines))

    def flush(self) -> None:
        if self.rest:
            with self.lock:
                self.write(f"{self.prefix}{self.rest}\n")
            self.rest = ""


def stream_logs(record: JobRecord, inventory: Inventory, registry: Registry, *, write: Callable[[str], None],
                say: Callable[[str], None], node: int | None = None, follow: bool = False,
                tail: int | None = None) -> dict[str, Any]:
    """Write the log through ``write`` (cleaned text); return the job's status: the terminal
    one when the end frames carried it (no further round trip), else asked of every node when
    following, else the registry's. ``node=None`` on a multi-node job merges every node's log,
    each line prefixed ``[node i]``. The whole log of an ended job is kept on the laptop
    (``logcache``) and printed from there next time, without a host."""
    whole = node is None and tail is None
    kept = logcache.load(record.job_id, record.status()) if whole else None
    if kept is not None:
        write(kept)
        return record.status()
    capture = logcache.Capture(write) if whole else None
    write = capture or write
    hosts = nodes_of(record, inventory)
    if node is not None and not 0 <= node < len(hosts):
        raise UsageError(f"{record.job_id} has {len(hosts)} node(s): --node {node} does not exist")
    if node is not None or len(hosts) == 1:
        index = node or 0
        finals = [follow_node(record, hosts[index], inventory, index, write=write, say=say, follow=follow, tail=tail)]
    else:
        lock = threading.Lock()
        writers = [_Prefixed(f"[node {i}] ", write, lock) for i in range(len(hosts))]

        def one(i: int) -> dict[str, Any] | None:
            final = follow_node(record, hosts[i], inventory, i, write=writers[i], say=say, follow=follow, tail=tail)
            writers[i].flush()
            if follow:
                probe(record, inventory, registry)  # a node that ended badly: stop the others now
            return final

        finals = parallel(one, list(range(len(hosts))))
    if len(finals) == len(hosts) and all(f is not None for f in finals):  # every end frame carried a terminal status
        status = aggregate(finals)  # type: ignore[arg-type]
        registry.update(record.job_id, status["state"], status)
    elif follow:
        status = probe(record, inventory, registry)
    else:
        return record.status()
    if capture is not None and capture.text() is not None:
        logcache.save(record.job_id, status, capture.text() or "")
    return status

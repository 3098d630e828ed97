"""Print or follow a job's node log by byte offset.

Following never ends on a dropped connection: it reconnects with backoff and continues at
the exact byte it had reached. A stalled connection is noticed too: the server sends a
heartbeat frame while the log is quiet, and no frame for ``3 × heartbeat`` counts as a
lost connection. It ends when the job is terminal and the log is drained; the server's end
frame then carries the node's terminal status, so the end costs no further round trip.

On a provider host each reconnect asks the provider for the instance's state first (the one
call ``access/provisioned.py``'s ``connectable`` makes, never per line): an instance that is
off, released or failed ends the follow (``jobs/nodes.py``: ``stopped_with_box``, exit 1 with
the provider's words and the way on) unless the job had already ended; a provider that cannot
be asked (its API down, the token refused) is one more failed reconnect, retried.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from typing import Any, Callable

from orchestrator import settings
from orchestrator.access.connect import open_transport
from orchestrator.access.provisioned import InstanceDown
from orchestrator.errors import HostError, RemoteError, UsageError
from orchestrator.helper.remote import Remote
from orchestrator.helper.session import StreamCall
from orchestrator.hosts.inventory import Host, Inventory
from orchestrator.jobs import logcache
from orchestrator.jobs.nodes import job_status, nodes_of, parallel, probe, stopped_with_box
from orchestrator.providers.api import ProviderAuthError, ProviderUnreachable
from orchestrator.state.registry import JobRecord, Registry
from orchestrator.termtext import CleanDecoder
from orchestrator.transport.base import never
from remote_payload.contract.bytequeue import ByteQueue
from remote_payload.contract.protocol import TERMINAL

MAX_BACKOFF_S = 30.0


class _Frames:
    """Reads ``follow``'s frames; a silence longer than ``timeout`` is a lost connection."""

    def __init__(self, remote: Remote, proc: StreamCall, timeout: float) -> None:
        self.remote, self.proc, self.buf = remote, proc, ByteQueue()
        if hasattr(proc, "settimeout"):
            proc.settimeout(timeout)

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            try:
                chunk = self.proc.read(max(1 << 20, n - len(self.buf)))
            except socket.timeout:
                raise HostError("no data or heartbeat from the server: the connection stalled") from None
            if not chunk:  # the reply came before the end frame: it says why
                self.remote.finish(self.proc, "reading the log")
                raise RemoteError(f"{self.remote.host.name}: the log stream ended without its end frame")
            self.buf.put(chunk)
        return self.buf.take(n)

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


class _Reading:
    """Where a node's log read stands across reconnects: the byte offset and the decoder."""

    def __init__(self, tail: int | None) -> None:
        self.decoder, self.tail, self.started = CleanDecoder(), tail, False
        self.offset: int | None = None if tail is not None else 0


def _read(remote: Remote, record: JobRecord, node: int, at: _Reading, write: Callable[[str], None],
          follow: bool) -> dict[str, Any] | None:
    """One connection's share of a node's log: from ``at.offset`` to the end frame."""
    if at.offset is None:
        at.offset = remote.call("tail_offset", job=record.job_id, node=node, lines=at.tail)["offset"]
    heartbeat_s = settings.LOG_HEARTBEAT.seconds()
    proc = remote.start("follow", job=record.job_id, offset=at.offset, node=node, follow=follow,
                        heartbeat=heartbeat_s)
    frames = _Frames(remote, proc, 3 * heartbeat_s)
    at.started = True
    while True:
        kind, data = frames.next()
        if kind == b"E":
            final = remote.laptop_status(end_status(data))
            break
        if kind == b"D":
            at.offset += len(data)
            write(at.decoder.feed(data))
    remote.finish(proc, "reading the log")
    write(at.decoder.feed(b"", final=True))
    return final


def follow_node(record: JobRecord, host: Host, inventory: Inventory, node: int, *, write: Callable[[str], None],
                say: Callable[[str], None], follow: bool, tail: int | None,
                remote: Remote | None = None) -> dict[str, Any] | None:
    """One node's log through ``write`` until it ends (``follow``: the node is terminal);
    returns the node's terminal status when the end frame carried one. ``remote``: a
    connection this command already holds to the host (``submit --follow``'s), used first;
    a reconnect opens a new one. ``InstanceDown`` (the provider says the box is off,
    released or failed) is raised, never retried; a provider that cannot be asked is."""
    at = _Reading(tail)
    backoff = 0.5
    while True:
        try:
            if remote is not None:
                held, remote = remote, None
                return _read(held, record, node, at, write, follow)
            with open_transport(host, inventory, never) as transport:
                return _read(Remote(host, transport), record, node, at, write, follow)
        except (HostError, ProviderUnreachable, ProviderAuthError) as exc:
            if not follow or isinstance(exc, InstanceDown):
                raise
            if at.started:
                backoff, at.started = 0.5, False
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


def log_hosts(record: JobRecord, inventory: Inventory) -> list[Host]:
    """The host of each node log, by node index: one per host, or for a job of one Slurm host,
    that host for each node of its allocation (``log_nodes`` in its status)."""
    hosts = nodes_of(record, inventory)
    count = record.detail.get("log_nodes")
    if len(hosts) == 1 and isinstance(count, int) and 1 < count <= 10_000:
        return hosts * count
    return hosts


def stream_logs(record: JobRecord, inventory: Inventory, registry: Registry, *, write: Callable[[str], None],
                say: Callable[[str], None], node: int | None = None, follow: bool = False,
                tail: int | None = None, remotes: dict[str, Remote] | None = None) -> dict[str, Any]:
    """Write the log through ``write`` (cleaned text); return the job's status: the terminal
    one when the end frames carried it (no further round trip), else asked of every node when
    following, else the registry's. ``node=None`` on a multi-node job merges every node's log,
    each line prefixed ``[node i]``. The whole log of an ended job is kept on the laptop
    (``logcache``; ``orch logs`` prints it from there next time, without a host). ``remotes``:
    connections this command already holds, by host name (``submit --follow``): used instead
    of new ones. Following, a box its provider says is down ends it (``stopped_with_box``:
    the recorded end of a job that ended first, else ``StoppedWithBox``, exit 1)."""
    remotes = remotes or {}
    capture = logcache.Capture(write) if node is None and tail is None else None
    write = capture or write
    hosts = log_hosts(record, inventory)
    if node is not None and not 0 <= node < len(hosts):
        raise UsageError(f"{record.job_id} has {len(hosts)} node(s): --node {node} does not exist")
    try:
        finals = _follow_nodes(record, hosts, inventory, registry, write, say, node, follow, tail, remotes)
    except InstanceDown as down:
        if not follow:
            raise
        return stopped_with_box(down, record, registry, inventory)
    if len(finals) == len(hosts) and all(f is not None for f in finals):  # every end frame carried a terminal status
        status = job_status(record, finals if len(record.hosts) > 1 else finals[:1])  # type: ignore[arg-type]
        registry.update(record.job_id, status["state"], status)
    elif follow:
        status = probe(record, inventory, registry)
    else:
        return record.status()
    if capture is not None and capture.text() is not None:
        logcache.save(record.job_id, status, capture.text() or "")
    return status


def _follow_nodes(record: JobRecord, hosts: list[Host], inventory: Inventory, registry: Registry,
                  write: Callable[[str], None], say: Callable[[str], None], node: int | None, follow: bool,
                  tail: int | None, remotes: dict[str, Remote]) -> list[dict[str, Any] | None]:
    """``follow_node`` for the one node asked (or the only one), else for every node at once,
    each line prefixed ``[node i]``; each node's terminal status from its end frame (or None)."""
    if node is not None or len(hosts) == 1:
        index = node or 0
        return [follow_node(record, hosts[index], inventory, index, write=write, say=say, follow=follow, tail=tail,
                            remote=remotes.get(hosts[index].name))]
    lock = threading.Lock()
    writers = [_Prefixed(f"[node {i}] ", write, lock) for i in range(len(hosts))]

    def one(i: int) -> dict[str, Any] | None:
        final = follow_node(record, hosts[i], inventory, i, write=writers[i], say=say, follow=follow, tail=tail,
                            remote=remotes.get(hosts[i].name))
        writers[i].flush()
        if follow:
            probe(record, inventory, registry)  # a node that ended badly: stop the others now
        return final

    return parallel(one, list(range(len(hosts))))

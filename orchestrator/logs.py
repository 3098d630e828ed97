"""Print or follow a job's node log by byte offset.

Following never ends on a dropped connection: it reconnects with backoff and continues at
the exact byte it had reached. It ends when the job is terminal and the log is drained.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from orchestrator.connect import never, open_transport
from orchestrator.errors import CommandFailed, HostError
from orchestrator.hosts import Inventory
from orchestrator.launch import job_host, probe
from orchestrator.registry import JobRecord, Registry
from orchestrator.remote import Remote
from orchestrator.termtext import CleanDecoder
from orchestrator.transport.base import Result

MAX_BACKOFF_S = 30.0


def stream_logs(record: JobRecord, inventory: Inventory, registry: Registry, *, write: Callable[[str], None],
                say: Callable[[str], None], node: int = 0, follow: bool = False,
                tail: int | None = None) -> dict[str, Any]:
    """Write the log through ``write`` (cleaned text); return the job's final status."""
    host = job_host(record, inventory)
    decoder = CleanDecoder()
    offset: int | None = None if tail is not None else 0
    backoff = 0.5
    while True:
        try:
            with open_transport(host, inventory, never) as transport:
                remote = Remote(host, transport)
                if offset is None:
                    offset = int(remote.call("tail-offset", record.job_id, str(node), str(tail))["offset"])
                proc = remote.start("follow", record.job_id, str(offset), str(node), "1" if follow else "0")
                while chunk := proc.read():
                    offset += len(chunk)
                    write(decoder.feed(chunk))
                code = proc.wait()
                if code != 0:
                    raise CommandFailed(Result(host.name, proc.command, code, b"", proc.stderr), "reading the log")
                write(decoder.feed(b"", final=True))
                return probe(record, inventory, registry, remote)
        except HostError as exc:
            if not follow:
                raise
            say(f"{exc}; reconnecting in {backoff:.1f} s (Ctrl-C stops following, the job keeps running)")
            time.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)

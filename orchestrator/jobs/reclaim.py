"""Reclaiming what orch keeps on a server (``orch gc``, ``orch rm``, a host's ``gc_keep_days``).

The server decides and removes (``remote_payload/helper/reclaim.py``, the ``gc`` request) under
its jobs lock; the laptop says what only it knows: the jobs whose outputs it fetched and
verified from that host (``Registry.record_fetched``), and its current checkout's workspace
(never removed). Every row of the reply is untrusted: checked (``ITEM``), its text cleaned
before it is printed. A job whose folder was removed keeps its local record: the registry is
brought to the state the server probed when it still says otherwise, so ``orch status`` shows it
from the record without asking the host.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from orchestrator.errors import OrchError, RemoteError
from orchestrator.helper.remote import Remote
from orchestrator.hosts.inventory import Host
from orchestrator.state.registry import TERMINAL, Registry
from orchestrator.sync.selection import project_name
from orchestrator.termtext import clean, size_text
from remote_payload.contract import protocol

KEEP_DAYS = 7.0  # finished jobs, superseded attempts and idle workspaces younger than this stay
KEEP = 3  # the newest finished jobs of each workspace stay, whatever their age
CLASSES = {"job": ("job folder", "job folders"), "payload": ("payload", "payloads"),
           "workspace": ("workspace", "workspaces"), "superseded": ("superseded attempt", "superseded attempts"),
           "staged": ("staged tree", "staged trees"), "temporary": ("temporary", "temporaries")}
ITEM: protocol.Shape = {"kind": (str, protocol.REQUIRED), "name": (str, protocol.REQUIRED),
                        "bytes": (int, protocol.REQUIRED), "note": (str, protocol.REQUIRED),
                        "at": (protocol.MAYBE_NUMBER, protocol.OPT), "status": (dict, protocol.OPT)}
Say = Callable[[str], None]


@dataclass(frozen=True)
class Rule:
    """What ``orch gc`` may remove: finished jobs fetched here (all with ``all_finished``) but
    the ``keep`` newest per workspace and those that ended within ``keep_days``; workspaces and
    superseded attempts idle over ``keep_days``; the rest by the server's own ages."""

    keep_days: float = KEEP_DAYS
    keep: int = KEEP
    all_finished: bool = False


@dataclass(frozen=True)
class Item:
    kind: str
    name: str  # under the host's root: jobs/<id>, payload/<hash>, workspace/<project>, ...
    bytes: int
    note: str
    at: float | None = None
    status: dict[str, Any] | None = None

    @property
    def job_id(self) -> str | None:
        return self.name.split("/", 1)[1] if self.kind == "job" else None

    def as_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "bytes": self.bytes, "note": self.note, "at": self.at}


@dataclass(frozen=True)
class Listing:
    """The server's answer: what is (or would be) removed, and why the rest stays."""

    host: str
    items: list[Item]
    kept: dict[str, int] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # job id -> why it stays (orch rm)
    missing: list[str] = field(default_factory=list)
    removed: bool = False

    @property
    def total(self) -> int:
        return sum(item.bytes for item in self.items)

    def by_class(self) -> dict[str, tuple[int, int]]:
        """kind -> (items, bytes), in ``CLASSES`` order."""
        out: dict[str, tuple[int, int]] = {}
        for kind in CLASSES:
            mine = [item.bytes for item in self.items if item.kind == kind]
            if mine:
                out[kind] = (len(mine), sum(mine))
        return out

    def summary(self) -> str:
        """``12.0 MB (3 job folders 11.2 MB, 1 payload 0.8 MB)`` (nothing: ``nothing``)."""
        if not self.items:
            return "nothing"
        parts = [f"{n} {CLASSES[kind][n != 1]} {size_text(size)}" for kind, (n, size) in self.by_class().items()]
        return f"{size_text(self.total)} ({', '.join(parts)})"

    def kept_line(self) -> str:
        """Why the rest stays, in one line ('' when nothing stays)."""
        words = [f"{n} {clean(why)[:60]}" for why, n in sorted(self.kept.items())]
        hint = " (--all-finished removes those)" if self.kept.get("not fetched") else ""
        return f"kept: {', '.join(words)}{hint}" if words else ""

    def as_json(self) -> dict[str, Any]:
        return {"host": self.host, "removed": self.removed, "items": [i.as_json() for i in self.items],
                "bytes": self.total, "kept": self.kept, "refused": self.refused, "missing": self.missing}


def checkout_projects(cwd: Path) -> list[str]:
    """The server folder names the current checkout may have: the project of the working
    directory and of each folder above it (``orch gc`` run anywhere inside a checkout)."""
    here = Path(os.path.realpath(cwd))
    return [project_name(p) for p in [here, *here.parents]]


def fetched_from(registry: Registry, host: str) -> list[str]:
    """The jobs whose outputs this laptop fetched from ``host``, verified, after they ended."""
    return [r.job_id for r in registry.all() if host in r.fetched]


def ask(remote: Remote, registry: Registry, rule: Rule, projects: list[str], *, dry_run: bool,
        only: list[str] | None = None, jobs: list[str] | None = None) -> Listing:
    """The ``gc`` request on ``remote``'s host, its reply checked; when something was removed,
    the registry brought to what the server probed (``remember``)."""
    reply = remote.call("gc", timeout=1800, dry_run=dry_run, keep_days=rule.keep_days, keep=rule.keep,
                        fetched=fetched_from(registry, remote.host.name), all_finished=rule.all_finished,
                        projects=projects, only=only, jobs=jobs)
    listing = _listing(remote.host.name, reply)
    if listing.removed:
        remember(registry, listing)
    return listing


def _listing(host: str, reply: dict[str, Any]) -> Listing:
    items = []
    for row in reply["items"]:
        try:
            protocol.check_shape("an item of the gc reply", row, ITEM)
            status = row.get("status")
            if status is not None:
                protocol.check_job_status("a removed job's status", status)
        except protocol.ProtocolError as exc:
            raise RemoteError(f"{host}: orch's helper answered gc with a malformed reply: {exc}") from None
        if row["kind"] not in CLASSES or row["bytes"] < 0:
            raise RemoteError(f"{host}: orch's helper answered gc with an unknown item {clean(row['kind'])[:40]!r}")
        items.append(Item(row["kind"], clean(row["name"])[:400], row["bytes"], clean(row["note"])[:200],
                          row.get("at"), status))
    kept = {clean(str(k))[:80]: v for k, v in reply["kept"].items() if isinstance(v, int) and not isinstance(v, bool)}
    refused = {clean(str(r.get("name")))[:200]: clean(str(r.get("why")))[:300] for r in reply["refused"]
               if isinstance(r, dict)}
    missing = [clean(str(m))[:200] for m in reply["missing"]]
    return Listing(host, items, kept, refused, missing, bool(reply["removed"]))


def remember(registry: Registry, listing: Listing) -> None:
    """Removed jobs keep their local record, in the terminal state their host probed."""
    known = {r.job_id: r for r in registry.all()}
    for item in listing.items:
        record = known.get(item.job_id or "")
        if record is None or item.status is None or record.state in TERMINAL:
            continue
        state = str(item.status.get("state"))
        if state in TERMINAL:
            registry.update(record.job_id, state, {k: v for k, v in item.status.items() if k not in ("state", "job_id")})


def auto(remote: Remote, host: Host, registry: Registry, projects: list[str], say: Say) -> None:
    """A host's ``gc_keep_days``: collect there at the end of a submit, saying in one line what
    it freed or why it could not; never raises (the submit has succeeded)."""
    if host.gc_keep_days is None:
        return
    try:
        listing = ask(remote, registry, Rule(keep_days=host.gc_keep_days), projects, dry_run=False)
    except (OrchError, OSError) as exc:
        say(f"{host.name}: gc skipped: {(str(exc).splitlines() or [type(exc).__name__])[0]}")
        return
    if listing.items:
        say(f"{host.name}: gc freed {listing.summary()}")

"""What the Python API returns: frozen records with the same fields the CLI's ``--json`` prints.

Each record keeps the object ``--json`` would print (``as_json()``), and names its common
fields as attributes. Nothing here connects or prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from remote_payload.contract.protocol import TERMINAL


@dataclass(frozen=True)
class Job:
    """A job a submit, rerun or resume started: ``orch submit --json``'s object (for a sweep,
    one element of its list): ``job_id``, ``hosts``, ``job_dir``, ``state`` when it was said;
    a sweep's job also ``sweep``, ``combination`` and ``values``; ``skipped``: started by an
    earlier submit of the same sweep."""

    job_id: str
    hosts: tuple[str, ...]
    job_dir: str | None
    state: str
    sweep: str | None = None
    combination: int | None = None
    values: Mapping[str, Any] = field(default_factory=dict)
    skipped: bool = False
    data: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def as_json(self) -> dict[str, Any]:
        """The object ``orch submit --json`` prints for this job."""
        return dict(self.data)


@dataclass(frozen=True)
class JobStatus:
    """A job as ``orch status JOB --json`` prints it: its ``state`` (pending, syncing,
    setting_up, queued, running, succeeded, failed, cancelled, lost), ``exit_code``,
    ``reason``, ``hosts``, ``job_dir``, ``name`` and ``progress`` (the row: step, total,
    loss, tokens/s, ETA, elapsed, cost)."""

    job_id: str
    state: str
    exit_code: int | None
    reason: str | None
    hosts: tuple[str, ...]
    job_dir: str
    name: str
    progress: Mapping[str, Any]
    data: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def finished(self) -> bool:
        """The job is in a terminal state (succeeded, failed, cancelled, lost)."""
        return self.state in TERMINAL

    @property
    def succeeded(self) -> bool:
        return self.state == "succeeded"

    def as_json(self) -> dict[str, Any]:
        """The object ``orch status JOB --json`` prints."""
        return dict(self.data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobStatus:
        exit_code = data.get("exit_code")
        return cls(str(data.get("job_id")), str(data.get("state")), exit_code if isinstance(exit_code, int) else None,
                   str(data["reason"]) if data.get("reason") is not None else None, tuple(data.get("hosts") or ()),
                   str(data.get("job_dir") or ""), str(data.get("name") or ""), dict(data.get("progress") or {}),
                   dict(data))


@dataclass(frozen=True)
class FetchResult:
    """What a fetch did, as ``orch fetch --json`` prints it: ``dest`` (the job's run folder),
    the names ``fetched`` now and ``unchanged`` (verified here already), ``bytes`` moved, the
    ``patterns`` used, whether the job had ``ended``, what the job wrote that no pattern
    selected (``not_fetched``) and names this laptop cannot hold (``unwritable``)."""

    job_id: str
    dest: Path
    fetched: tuple[str, ...]
    unchanged: tuple[str, ...]
    bytes: int
    patterns: tuple[str, ...]
    ended: bool
    not_fetched: tuple[Mapping[str, Any], ...]
    unwritable: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        """The object ``orch fetch --json`` prints."""
        return {"job_id": self.job_id, "dest": str(self.dest), "fetched": list(self.fetched),
                "unchanged": list(self.unchanged), "bytes": self.bytes, "patterns": list(self.patterns),
                "ended": self.ended, "not_fetched": [dict(n) for n in self.not_fetched],
                "unwritable": list(self.unwritable)}


@dataclass(frozen=True)
class HostInfo:
    """A host of the inventory as ``orch hosts ls --json`` prints it: ``name``, ``target``
    (``user@address:port``, or ``local``), ``root``, whether its key is pinned; a provider
    host also ``provider`` (its state, price, days until release); a broken entry only
    ``broken`` (why)."""

    name: str
    target: str | None
    root: str | None
    key_pinned: bool
    provider: Mapping[str, Any] | None = None
    broken: str | None = None

    def as_json(self) -> dict[str, Any]:
        """The object ``orch hosts ls --json`` prints for this host."""
        if self.broken is not None:
            return {"name": self.name, "broken": self.broken}
        return {"name": self.name, "target": self.target, "root": self.root, "key_pinned": self.key_pinned,
                **({"provider": dict(self.provider)} if self.provider is not None else {})}

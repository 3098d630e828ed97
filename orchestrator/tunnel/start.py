"""A tunnel from a name and port words, as ``orch tunnel`` and ``orchestrator.api`` open it."""

from __future__ import annotations

from typing import Callable, Sequence

from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import Inventory
from orchestrator.tunnel.link import Link
from orchestrator.tunnel.listen import Tunnel
from orchestrator.tunnel.ports import Forward, parse
from orchestrator.tunnel.target import Target


def forwards_for(target: Target, words: Sequence[str], local: Sequence[int]) -> list[Forward]:
    """What to forward: ``words`` (``PORT``, ``HOST:PORT``), else a job's ``launch.ports``;
    ``UsageError`` when there is neither. On ``local`` only the ports themselves make sense."""
    if not words and target.job is not None:
        words = [str(p) for p in target.job.ports]
        if not words:
            raise UsageError(f"{target.job.job_id} has no launch.ports: name the port, e.g. "
                             f"orch tunnel {target.job.job_id} 6006")
    if not words:
        raise UsageError(f"name the port(s) of {target.host.name} to forward, e.g. orch tunnel {target.host.name} 6006")
    forwards = parse(words, local)
    if target.host.kind == "local" and any(f.local not in (f.port, 0) or f.address for f in forwards):
        raise UsageError("local is this machine: its ports are here already, there is nothing to forward "
                         "(--local and HOST:PORT do not apply)")
    return forwards


def open_tunnel(target: Target, forwards: list[Forward], inventory: Inventory, bind: str,
                say: Callable[[str], None]) -> Tunnel:
    """The tunnel bound, connected and accepting (``Tunnel.lines`` says where); ``close`` ends
    it. A taken local port is ``UsageError``, a host that cannot be reached ``HostError``."""
    if target.host.kind == "local":
        raise UsageError("local is this machine: its ports are here already, no tunnel is needed")
    tunnel = Tunnel(Link(target, inventory, say), forwards, bind, say)
    tunnel.open()
    tunnel.start()
    return tunnel

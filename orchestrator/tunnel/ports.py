"""What ``orch tunnel`` forwards: ``PORT`` or ``HOST:PORT`` on the server's side, each to a local port."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from orchestrator.errors import UsageError


@dataclass(frozen=True)
class Forward:
    """``address:port`` as the server sees it, reached at ``local`` on the laptop (0: a free
    port, chosen when it is bound). ``address`` ``None``: the job's node (``localhost`` on an
    SSH box, the compute node of a Slurm job)."""

    address: str | None
    port: int
    local: int

    def far(self, node: str) -> str:
        """``address:port`` with the node filled in (IPv6 in brackets)."""
        address = self.address or node
        return f"[{address}]:{self.port}" if ":" in address else f"{address}:{self.port}"


def _port(word: str, what: str, low: int) -> int:
    if not word.isdigit() or not low <= int(word) <= 65535:
        raise UsageError(f"{what} {word!r} is not a port number ({low} to 65535)")
    return int(word)


def parse(words: Sequence[str], local: Sequence[int]) -> list[Forward]:
    """One ``Forward`` per word (``6006``, ``HOST:6006``, ``[::1]:6006``); the ``--local`` ports
    pair with them in order, and a port without one is reached at the same number locally."""
    if len(local) > len(words):
        raise UsageError(f"{len(local)} --local ports for {len(words)} port(s): give one --local per port, in order")
    found: list[Forward] = []
    for i, word in enumerate(words):
        address, sep, number = word.rpartition(":")
        if sep and not address:
            raise UsageError(f"{word!r}: HOST:PORT needs a host before the colon")
        address = address[1:-1] if address.startswith("[") and address.endswith("]") else address
        port = _port(number, "PORT", 1)
        near = local[i] if i < len(local) else port
        if not 0 <= near <= 65535:
            raise UsageError(f"--local {near} is not a port number (0 for a free one, else 1 to 65535)")
        found.append(Forward(address or None, port, near))
    taken = [f.local for f in found if f.local]
    twice = sorted({p for p in taken if taken.count(p) > 1})
    if twice:
        raise UsageError(f"local port {', '.join(map(str, twice))} is asked for twice: give each its own --local")
    return found

"""Open the right transport for a host and pin new host keys in the inventory."""

from __future__ import annotations

import sys
from typing import Callable

from orchestrator.hosts import Host, Inventory
from orchestrator.transport.base import Transport
from orchestrator.transport.local import LocalTransport


def never(fingerprint: str) -> bool:
    return False


def ask_on_tty(fingerprint: str) -> bool:
    """Ask a person at a terminal; a non-interactive run never trusts an unknown key."""
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return False
    import click

    return click.confirm(f"The host presents the key {fingerprint}. Trust it and pin it?", default=False, err=True)


def open_transport(host: Host, inventory: Inventory | None = None,
                   trust: Callable[[str], bool] = ask_on_tty,
                   pin: Callable[[str], None] | None = None) -> Transport:
    """Connect to ``host``. A key accepted through ``trust`` goes to ``pin`` when given
    (``orch hosts add`` keeps it in memory until the entry is complete); otherwise it is
    pinned in the inventory entry (when the host is an inventory entry)."""
    if host.kind == "local":
        return LocalTransport(host.name)
    from orchestrator.transport.ssh import SSHTransport

    def save_pin(line: str) -> None:
        if inventory is not None and (inventory.dir / f"{host.name}.json").is_file():
            inventory.save(inventory.get(host.name).model_copy(update={"host_key": line}))

    return SSHTransport(host, trust=trust, on_new_key=pin or save_pin)

"""Open the right transport for a host and pin new host keys in the inventory.

An SSH host with a pinned host key goes through its connection holder when one is running
(``orchestrator/holder/client.py``; docs/connections.md); otherwise it connects directly and starts a
holder in the background for the next command. ``ORCH_HOLD=0`` turns holders off.
"""

from __future__ import annotations

from typing import Callable, Sequence

from orchestrator import trace
from orchestrator.ask import confirm
from orchestrator.holder import client as held
from orchestrator.hosts.inventory import Host, Inventory
from orchestrator.transport.base import Transport
from orchestrator.transport.local import LocalTransport


def ask_on_tty(fingerprint: str) -> bool:
    """Ask a person at a terminal; a non-interactive run never trusts an unknown key."""
    return confirm(f"The host presents the key {fingerprint}. Trust it and pin it?", default=False) is True


def open_transport(host: Host, inventory: Inventory | None = None,
                   trust: Callable[[str], bool] = ask_on_tty,
                   pin: Callable[[str], None] | None = None, warm: Sequence[str] | None = None) -> Transport:
    """Connect to ``host``. A key accepted through ``trust`` goes to ``pin`` when given
    (``orch hosts add`` keeps it in memory until the entry is complete); otherwise it is
    pinned in the inventory entry (when the host is an inventory entry).

    A host with a pinned key: its holder's connection when one answers (a holder only ever
    connects with the pinned key, and its socket's name covers that key and the credentials),
    else a direct connection, after which a holder is started without waiting for it. A host
    without one (first contact) always connects directly, and so does a provider host, at the
    endpoint its provider gives now (``HostError`` when its instance is not running). ``warm``:
    the argv a holder started here keeps a spare of from its start (orch's helper: ``spawn``)."""
    if host.kind == "local":
        return LocalTransport(host.name)
    provided = host.provider is not None
    if provided and not host.address:  # the endpoint its provider gives now (access/provisioned.py)
        from orchestrator.access.provisioned import connectable

        host = connectable(host)

    def save_pin(line: str) -> None:
        if inventory is not None and (inventory.dir / f"{host.name}.json").is_file():
            inventory.save(inventory.get(host.name).model_copy(update={"host_key": line}))

    def direct() -> Transport:
        from orchestrator.transport.ssh import SSHTransport

        return SSHTransport(host, trust=trust, on_new_key=pin or save_pin)

    t0 = trace.since_start_ms()
    if not host.host_key or not held.enabled() or provided:
        connected = direct()
        trace.mark("connect", f"{host.name}: direct SSH connection in {trace.since_start_ms() - t0:.0f} ms")
        return connected
    transport = held.reach(host, direct)
    if transport is not None:
        trace.mark("connect", f"{host.name}: its connection holder answered in {trace.since_start_ms() - t0:.0f} ms")
        return transport
    t1 = trace.since_start_ms()
    connected = direct()
    from orchestrator.holder.spawn import spawn

    spawn(host, warm)
    trace.mark("connect", f"{host.name}: no holder ({t1 - t0:.0f} ms to tell); direct SSH connection in "
               f"{trace.since_start_ms() - t1:.0f} ms; a holder started for the next command")
    return connected

"""Provider hosts powered on and proven, around the commands that need them: the SSH login
that proves a box answers (``login``), the provider's price kept in the entry
(``remember_price``), a job's hosts that are off powered on before its submit after a yes
(``power_on_first``) and off after a watched job with ``on_finish.power_off``
(``power_off_after``), a running one made ready for the system ssh and VSCode
(``ready_for_system_ssh``), and what ``orch hosts check`` says of one before the checks on the
box (``instance_ready``).

Nothing here asks a person or prints: questions go through a ``confirm`` callback (None: no
one to ask), progress through ``say``. Without a yes nothing is powered on (billing starts).
The providers' code is imported only when a host has a provider (a plain submit loads none).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from orchestrator.access import keys
from orchestrator.access.connect import ask_on_tty, open_transport
from orchestrator.errors import UsageError
from orchestrator.hosts.sshconfig import remember_seen
from orchestrator.transport.base import never

if TYPE_CHECKING:
    from orchestrator.hosts.inventory import Host, Inventory
    from orchestrator.spec.load import LoadedSpec


def login(inventory: Inventory, say: Callable[[str], None], trust: bool) -> Callable[[Host], None]:
    """An SSH login that runs ``true``: the proof that the box answers. A first host key is
    pinned in the entry with ``trust`` (its fingerprint said), else asked about on a terminal;
    never accepted silently. A pinned key that differs is refused (exit 3)."""
    def accept(fingerprint: str) -> bool:
        if trust:
            say(f"pinned host key {fingerprint}")
            return True
        return ask_on_tty(fingerprint)

    def run(live: Host) -> None:
        with open_transport(live, inventory, accept) as transport:
            transport.run(["true"], timeout=60)
    return run


def remember_price(inventory: Inventory, host: Host) -> None:
    """The price per hour the provider reports, kept in the entry so that `orch status`'s
    COST uses it (a price is no secret); nothing changes when it reports none."""
    from orchestrator.providers.open import provider_of

    assert host.provider is not None
    price = provider_of(host).instance(host.provider.instance).price_per_hour
    if price is not None and price != host.price_per_hour:
        inventory.save(inventory.get(host.name).model_copy(update={"price_per_hour": price}))


def provider_hosts(inventory: Inventory, loaded: LoadedSpec) -> list[Host]:
    """The job's hosts that are rented through a provider (inventory names only)."""
    return [h for h in (inventory.resolve(ref) for ref in loaded.spec.hosts) if h.provider is not None]


@dataclass(frozen=True)
class PowerOn:
    """What ``power_on_first`` found: ``go_on`` false only for a dry run that stops at the
    hosts it would power on, each in ``would_power_on`` as ``{host, provider, instance,
    state, price_per_hour, currency}``."""

    go_on: bool
    would_power_on: tuple[dict[str, object], ...] = ()


def power_on_first(inventory: Inventory, loaded: LoadedSpec, spec_file: Path, *, yes: bool,
                   confirm: Callable[[str], bool | None], say: Callable[[str], None],
                   dry_run: bool = False) -> PowerOn:
    """Power on every provider host of the job that is off, each after ``yes`` or a yes from
    ``confirm(question)``, and wait until SSH answers. ``UsageError`` (exit 2) when the answer
    is no, or None (no one to ask: the message gives the command with ``--yes``); nothing is
    submitted then. A dry run powers nothing on: it says what it would and returns
    ``go_on=False`` with those hosts (the plan needs the box on: it asks the host's helper
    for its facts). A job without provider hosts loads no provider code."""
    hosts = provider_hosts(inventory, loaded)
    if not hosts:
        return PowerOn(True)
    from orchestrator.access.provisioned import bring_up, describe
    from orchestrator.providers.open import provider_of

    off: list[tuple[Host, str]] = []
    rows: list[dict[str, object]] = []
    for host in hosts:
        assert host.provider is not None
        provider = provider_of(host)
        state, _ = provider.state(host.provider.instance)
        if state != "running":
            found = provider.instance(host.provider.instance)
            off.append((host, f"{provider.name} instance {host.provider.instance}, {describe(found)}"))
            rows.append({"host": host.name, "provider": provider.name, "instance": found.id, "state": found.status,
                         "price_per_hour": found.price_per_hour, "currency": found.currency})
    if not off:
        return PowerOn(True)
    if dry_run:
        for host, what in off:
            say(f"would power on {host.name} ({what}); the plan is shown once it is on")
        return PowerOn(False, tuple(rows))
    for host, what in off:
        answer = yes or confirm(f"{host.name} is off ({what}). Power it on (billing starts)?")
        if answer is None:
            raise UsageError(f"{host.name} is off ({what}); to power it on and submit: "
                             f"orch submit {shlex.quote(str(spec_file))} --yes (or first: orch up {host.name})")
        if not answer:
            raise UsageError(f"{host.name} is off and stays off: nothing was submitted")
        bring_up(host, say, login(inventory, say, trust=False))
        remember_price(inventory, host)
    return PowerOn(True)


def power_off_after(inventory: Inventory, loaded: LoadedSpec, say: Callable[[str], None]) -> None:
    """``on_finish.power_off`` seen from a watching laptop: power the job's provider hosts off
    through the API once the job ended and the watch's last fetch is done."""
    if not loaded.spec.on_finish.power_off:
        return
    from orchestrator.access.provisioned import bring_down

    for host in provider_hosts(inventory, loaded):
        say(f"on_finish.power_off: powering {host.name} off")
        bring_down(host, say)
        say(f"{host.name}: off")


RELEASE_WARN_DAYS = 3  # a powered-off instance its provider releases sooner is warned about


def instance_ready(host: Host, say: Callable[[str], None]) -> bool:
    """A provider host's instance as its provider reports it now (``facts``, its errors raised):
    its state and price said, a warning when the provider releases it (its data disk with it)
    in under ``RELEASE_WARN_DAYS`` days; true when it is running, so that the checks on the box
    can follow, else said how to power it on."""
    from orchestrator.access.provisioned import facts

    row = facts(host, strict=True)
    say(f"{host.name}: {row['provider']} instance {row['instance']} is {row['state']}" +
        (f", {row['price_per_hour']:g} {row['currency']}/h" if row.get("price_per_hour") is not None else ""))
    left = row.get("release_in_days")
    if isinstance(left, float) and left < RELEASE_WARN_DAYS:
        say(f"warning: {host.name}: {row['provider']} releases this powered-off instance in {left:.1f} days "
            f"(its data disk with it): power it on before then (`orch up {host.name}`)")
    if row["state"] != "running":
        say(f"{host.name}: the checks on the box need it on: orch up {host.name}")
        return False
    return True


def ready_for_system_ssh(inventory: Inventory, host: Host, say: Callable[[str], None]) -> Host:
    """A provider host made ready for the system ssh and VSCode: its endpoint now (exit 3
    naming `orch up` when it is off), orch's own key in the box's authorized_keys when the
    provider gives a password (AutoDL; added once, kept across power cycles with the disk),
    and the endpoint kept in the entry (``Host.seen``, no password) for the ssh-config block.
    Returns the host at that endpoint (``Host.live``): what the command connects to next,
    without asking the provider again."""
    from orchestrator.access.provisioned import connectable

    assert host.provider is not None
    if not host.host_key:
        raise UsageError(f"{host.name}: no pinned host key yet: `orch up {host.name} --trust` first")
    live = connectable(host)
    if not host.identity_file:
        _, public = keys.orch_key(None, say)
        with open_transport(live, inventory, never) as transport:
            if keys.install_key(transport, live, public) == "added":
                say(f"{host.name}: orch's key added to {live.user}'s authorized_keys on the box: the system ssh "
                    "and VSCode log in with it")
    remember_seen(inventory, host, live)
    return live

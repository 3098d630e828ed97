"""What ``orch submit`` does for provider hosts: power an instance that is off on first (after a
yes), and power it off after a watched job with ``on_finish.power_off``.

Without a terminal and without ``--yes`` nothing is powered on: exit 2 with the command to
run. ``--dry-run`` only says what would be powered on (the plan needs the box on: it asks
the host's helper for its facts).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from typing import TYPE_CHECKING

from orchestrator.ask import confirm
from orchestrator.cli.app import App
from orchestrator.errors import UsageError

if TYPE_CHECKING:
    from orchestrator.hosts.inventory import Host
    from orchestrator.spec.load import LoadedSpec


def provider_hosts(app: App, loaded: LoadedSpec) -> list[Host]:
    """The job's hosts that are rented through a provider (inventory names only)."""
    return [h for h in (app.inventory.resolve(ref) for ref in loaded.spec.hosts) if h.provider is not None]


def power_on_first(app: App, loaded: LoadedSpec, spec_file: Path, yes: bool, dry_run: bool,
                   as_json: bool = False) -> bool:
    """Power on every provider host of the job that is off; true when the submit may go on
    (false: a dry run that stops at what it would power on, with ``as_json`` printed as
    ``{"dry_run": true, "power_on": [{host, provider, instance, state, price_per_hour}]}``)."""
    hosts = provider_hosts(app, loaded)
    if not hosts:  # the providers' code is loaded only for a job that has such a host
        return True
    from orchestrator.access.provisioned import bring_up, describe
    from orchestrator.cli.provision import login, remember_price
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
        return True
    if dry_run:
        for host, what in off:
            app.say(f"would power on {host.name} ({what}); the plan is shown once it is on")
        if as_json:
            app.json({"dry_run": True, "power_on": rows})
        return False
    for host, what in off:
        answer = yes or confirm(f"{host.name} is off ({what}). Power it on (billing starts)?", default=False)
        if answer is None:
            raise UsageError(f"{host.name} is off ({what}); to power it on and submit: "
                             f"orch submit {shlex.quote(str(spec_file))} --yes (or first: orch up {host.name})")
        if not answer:
            raise UsageError(f"{host.name} is off and stays off: nothing was submitted")
        bring_up(host, app.say, login(app, trust=False))
        remember_price(app, host)
    return True


def power_off_after(app: App, loaded: LoadedSpec) -> None:
    """``on_finish.power_off`` seen from a watching laptop: power the job's provider hosts off
    through the API once the job ended and the watch's last fetch is done."""
    if not loaded.spec.on_finish.power_off:
        return
    from orchestrator.access.provisioned import bring_down

    for host in provider_hosts(app, loaded):
        app.say(f"on_finish.power_off: powering {host.name} off")
        bring_down(host, app.say)
        app.say(f"{host.name}: off")

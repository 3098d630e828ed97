"""``orch up`` / ``orch down`` / ``orch release``: power a provider host on (until SSH answers)
or off, or give its instance back."""

from __future__ import annotations

import click

from orchestrator.access.power import login, remember_price
from orchestrator.access.provisioned import bring_down, bring_up
from orchestrator.ask import confirm
from orchestrator.cli.app import App, pass_app
from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import Host
from orchestrator.hosts.sshconfig import renew_user_config
from orchestrator.providers.open import provider_of


def provider_host(app: App, name: str) -> Host:
    host = app.inventory.get(name)
    if host.provider is None:
        raise UsageError(f"{name} is not a provider host: `orch up`/`down` need one added with "
                         f"`orch hosts add {name} --provider autodl --instance ID --token-env VAR` "
                         "or rented with `orch rent`")
    return host


@click.command("up")
@click.argument("name")
@click.option("--trust", is_flag=True, help="Pin the host key the box offers when none is pinned yet.")
@pass_app
def up_cmd(app: App, name: str, trust: bool) -> None:
    """Power a provider host on and wait until SSH answers (credentials re-read on each try).

    \b
    Example:
      orch up a100 --trust     # the first time: pin the box's host key
    """
    host = provider_host(app, name)
    live = bring_up(host, app.say, login(app.inventory, app.say, trust))
    remember_price(app.inventory, host)
    renew_user_config(app.inventory, app.inventory.get(name), live, app.say)
    app.say(f"{name}: up, SSH answers at {live.user}@{live.address}:{live.port}")


@click.command("down")
@click.argument("name")
@pass_app
def down_cmd(app: App, name: str) -> None:
    """Power a provider host off and wait until the provider says it is off (billing stops).

    \b
    Example:
      orch down a100
    """
    host = provider_host(app, name)
    bring_down(host, app.say)
    app.say(f"{name}: off")


@click.command("release")
@click.argument("name")
@click.option("-y", "--yes", is_flag=True, help="Do not ask (scripts).")
@pass_app
def release_cmd(app: App, name: str, yes: bool) -> None:
    """Give a provider host's instance back for good (AutoDL: a powered-off one; vast, RunPod:
    destroyed in any state; its disks are deleted) and remove the host entry. Asks first;
    --yes for scripts.

    \b
    Examples:
      orch down a100 && orch release a100
      orch release rented4090 --yes
    """
    host = provider_host(app, name)
    assert host.provider is not None
    provider, instance = provider_of(host), host.provider.instance
    state, status = provider.state(instance)
    if state == "released":
        app.inventory.remove(name)
        app.say(f"{name}: {provider.name} instance {instance} was already {status or state}; "
                "the host entry is removed")
        return
    if provider.release_needs_off and state != "off":
        raise UsageError(f"{name}: the {provider.name} instance {instance} is {status or state}; "
                         f"power it off first: orch down {name}")
    answer = yes or confirm(f"Release {provider.name} instance {instance} ({name}, {status or state})? "
                            "Its disks are deleted.", default=False)
    if answer is None:
        raise UsageError(f"releasing deletes the instance and its disks: orch release {name} --yes")
    if not answer:
        raise UsageError(f"{name} was not released")
    provider.release(instance)
    app.inventory.remove(name)
    app.say(f"{name}: {provider.name} instance {instance} released; the host entry is removed")


COMMANDS = [up_cmd, down_cmd, release_cmd]

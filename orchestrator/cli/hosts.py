"""``orch hosts add/ls/rm/trust``."""

from __future__ import annotations

import sys

import click
from rich.table import Table

from orchestrator.cli.app import App, pass_app
from orchestrator.connect import open_transport
from orchestrator.errors import UsageError
from orchestrator.hosts import DEFAULT_ROOT, LOCAL, Host, parse_ssh_command
from orchestrator.presets import PRESETS
from orchestrator.remote import Remote
from orchestrator.spec import ENV_KEY_RE


@click.group("hosts")
def hosts_group() -> None:
    """Manage the host inventory (`local` is built in)."""


def _trust(app: App, host: Host) -> Host:
    """Connect, pin the offered key in the entry, and show its fingerprint."""
    shown: list[str] = []

    def accept(fingerprint: str) -> bool:
        shown.append(fingerprint)
        return True

    with open_transport(host, app.inventory, accept) as transport:
        hello = Remote(host, transport).call("hello")
    pinned = app.inventory.get(host.name)
    if shown:
        app.say(f"{host.name}: pinned host key {shown[0]}")
    else:
        app.say(f"{host.name}: host key matches the pinned one")
    app.say(f"{host.name}: python {hello.get('python_version')} at {hello.get('python')}, root {hello.get('root')}")
    return pinned


def _kept_key(app: App, old: Host, new: Host, keep_key: bool) -> str | None:
    """Re-adding a host keeps its pinned key when the address is the same; after a move
    (a new port after an AutoDL restart) only when the user confirms or passes --keep-key."""
    if (old.address, old.port) == (new.address, new.port) or keep_key:
        return old.host_key
    if sys.stdin.isatty() and click.confirm(
        f"{old.name} moved from {old.address}:{old.port} to {new.address}:{new.port}. "
        "Keep requiring the same host key (yes for a restarted instance)?", default=True, err=True
    ):
        return old.host_key
    app.say(f"{old.name}: the pinned host key was dropped (the address changed); pin the new one with "
            f"`orch hosts trust {old.name}` or pass --keep-key")
    return None


@hosts_group.command("add")
@click.argument("name")
@click.option("--ssh", "ssh_command", required=True, help='What the provider shows, e.g. "ssh -p 23456 root@host".')
@click.option("--identity", type=click.Path(dir_okay=False), help="Private key file.")
@click.option("--password-env", help="Name of the environment variable that holds the password (never stored).")
@click.option("--root", help=f"Where orch keeps its files on the host (default {DEFAULT_ROOT}, autodl: the data disk).")
@click.option("--python", "python", default=None, help="The host's python (found through a login shell).")
@click.option("--preset", "presets", multiple=True, type=click.Choice(sorted(PRESETS)), help="Provider preset.")
@click.option("--trust", is_flag=True, help="Connect now and pin the host key the server offers.")
@click.option("--keep-key", is_flag=True, help="When the address or port changed, keep checking the pinned key.")
@pass_app
def add_cmd(app: App, name: str, ssh_command: str, identity: str | None, password_env: str | None,
            root: str | None, python: str | None, presets: tuple[str, ...], trust: bool, keep_key: bool) -> None:
    """Add or update a host.

    \b
    Examples:
      orch hosts add box --ssh "ssh -p 23456 root@region-9.example.com" --identity ~/.ssh/id_ed25519 --trust
      AUTODL_PW=... orch hosts add a100 --ssh "ssh -p 40022 root@connect.example.com" \\
          --password-env AUTODL_PW --preset autodl --trust
    """
    if name == LOCAL:
        raise UsageError("`local` is built in")
    if password_env is not None and not ENV_KEY_RE.match(password_env):
        raise UsageError(f"--password-env wants a variable NAME (like AUTODL_PW), got {password_env!r}")
    fields = parse_ssh_command(ssh_command)
    if identity:
        fields["identity_file"] = identity
    preset_root = next((PRESETS[p].root for p in presets if PRESETS[p].root), None)
    old = app.inventory.get(name) if (app.inventory.dir / f"{name}.json").is_file() else None
    try:
        host = Host(name=name, password_env=password_env, root=root or preset_root or DEFAULT_ROOT,
                    python=python or "python3", presets=list(presets), **fields)  # type: ignore[arg-type]
    except ValueError as exc:
        raise UsageError(f"invalid host: {exc}") from None
    if old is not None and old.host_key:
        host = host.model_copy(update={"host_key": _kept_key(app, old, host, keep_key)})
    app.inventory.save(host)
    app.say(f"saved {name}: {host.target}, root {host.root}")
    if trust:
        _trust(app, host)
    elif host.host_key is None:
        app.say(f"its host key is not pinned yet: orch hosts trust {name}")


@hosts_group.command("trust")
@click.argument("name")
@click.option("--replace", is_flag=True, help="Forget the pinned key first (after a reinstall).")
@pass_app
def trust_cmd(app: App, name: str, replace: bool) -> None:
    """Connect and pin the host key the server offers (shows its fingerprint).

    \b
    Example:
      orch hosts trust box
    """
    host = app.inventory.get(name)
    if host.kind == "local":
        raise UsageError("`local` needs no host key")
    if replace and host.host_key:
        host = host.model_copy(update={"host_key": None})
        app.inventory.save(host)
    _trust(app, host)


@hosts_group.command("ls")
@pass_app
def ls_cmd(app: App) -> None:
    """List hosts."""
    table = Table(box=None, pad_edge=False)
    for column in ("NAME", "TARGET", "ROOT", "PYTHON", "AUTH", "KEY"):
        table.add_column(column)
    for host in [app.inventory.local(), *app.inventory.list()]:
        auth = "-" if host.kind == "local" else (f"${host.password_env}" if host.password_env else
                                                  (host.identity_file or "agent/default keys"))
        key = "-" if host.kind == "local" else ("pinned" if host.host_key else "NOT PINNED")
        table.add_row(host.name, host.target, host.root, host.python, auth, key)
    app.out.print(table)


@hosts_group.command("rm")
@click.argument("name")
@pass_app
def rm_cmd(app: App, name: str) -> None:
    """Remove a host from the inventory (its files on the server stay)."""
    app.inventory.remove(name)
    app.say(f"removed {name}")


COMMANDS = [hosts_group]

"""``orch hosts add/ls/rm/trust/check``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from orchestrator.access import enroll
from orchestrator.access.power import instance_ready
from orchestrator.checks.preflight import Needs, preflight_hosts
from orchestrator.checks.verdict import table
from orchestrator.cli.app import App, pass_app
from orchestrator.errors import UsageError
from orchestrator.helper.remote import Remote
from orchestrator.hosts import entry
from orchestrator.hosts.inventory import DEFAULT_ROOT, LOCAL, Host
from orchestrator.providers.registry import NAMES as PROVIDER_NAMES
from orchestrator.providers.registry import PRESETS
from orchestrator.spec.model import ENV_KEY_RE
from orchestrator.transport.base import Transport


@click.group("hosts")
def hosts_group() -> None:
    """Manage the host inventory (`local` is built in)."""


def _hello(host: Host, transport: Transport) -> dict[str, Any]:
    """The helper's hello on ``transport`` (it installs the helper first): what ``hosts
    add --trust`` and ``hosts trust`` prove a host with (``access/enroll.py``)."""
    return Remote(host, transport).call("hello")


def _confirm_kept(question: str) -> bool:
    """Asked at a terminal only (yes by default): keep a moved host's pinned key?"""
    return sys.stdin.isatty() and click.confirm(question, default=True, err=True)


@hosts_group.command("add")
@click.argument("name")
@click.option("--ssh", "ssh_command", default=None, help='What the provider shows, e.g. "ssh -p 23456 root@host".')
@click.option("--provider", type=click.Choice(PROVIDER_NAMES), default=None,
              help="A rented instance: address, port and password come from the provider's API on each connect.")
@click.option("--instance", default=None, help="The provider's instance id (with --provider).")
@click.option("--token-env", default=None, help="Name of the variable holding the provider's API token (never stored).")
@click.option("--api-url", default=None, help="The provider's API (default: its own): a proxy, or a stand-in.")
@click.option("--identity", type=click.Path(dir_okay=False), help="Private key file.")
@click.option("--password-env", help="Name of the environment variable that holds the password (never stored).")
@click.option("--root", help=f"Where orch keeps its files on the host (default {DEFAULT_ROOT}, autodl: the data disk).")
@click.option("--python", "python", default=None, help="The host's python (found through a login shell).")
@click.option("--preset", "presets", multiple=True, type=click.Choice(sorted(PRESETS)), help="Provider preset.")
@click.option("--trust", is_flag=True, help="Connect now and pin the host key the server offers.")
@click.option("--keep-key", is_flag=True, help="When the address or port changed, keep checking the pinned key.")
@click.option("--install-key", is_flag=True,
              help="Log in once with --password-env, install your public key, and use the key from then on.")
@click.option("--key", "key", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The key for --install-key (default ~/.ssh/id_ed25519 or id_rsa; made when none exists).")
@click.option("--price-per-hour", type=click.FloatRange(min=0), default=None,
              help="What the box costs per hour: `orch status` shows a cost estimate.")
@click.option("--idle-shutdown-minutes", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Power the box off after this long with no orch job running (cost guard).")
@click.option("--gc-keep-days", type=click.FloatRange(min=0), default=None, metavar="N",
              help="Collect at the end of each submit as `orch gc HOST --keep-days N --yes` does (one line says "
                   "what it freed; never fails the submit).")
@click.option("--scheduler", type=click.Choice(["none", "slurm"]), default="none",
              help="slurm: the address is a cluster's login node; jobs go through sbatch (docs/slurm.md).")
@click.option("--partition", default=None, help="Slurm partition for this host's jobs (default: the cluster's).")
@click.option("--account", default=None, help="Slurm account to charge.")
@click.option("--qos", default=None, help="Slurm quality of service.")
@click.option("--slurm-env", "slurm_env", multiple=True, metavar="NAME=VALUE",
              help="Environment for Slurm's commands on the login node, e.g. SLURM_CONF=/etc/slurm/lab.conf.")
@pass_app
def add_cmd(app: App, name: str, ssh_command: str | None, provider: str | None, instance: str | None,
            token_env: str | None, api_url: str | None, identity: str | None, password_env: str | None,
            root: str | None, python: str | None, presets: tuple[str, ...], trust: bool, keep_key: bool,
            install_key: bool, key: Path | None, price_per_hour: float | None,
            idle_shutdown_minutes: float | None, gc_keep_days: float | None, scheduler: str,
            partition: str | None, account: str | None,
            qos: str | None, slurm_env: tuple[str, ...]) -> None:
    """Add or update a host.

    With --trust or --install-key it connects first and saves the entry only when every step
    worked; otherwise it says "not saved" and an existing entry stays as it was.

    \b
    Examples:
      orch hosts add box --ssh "ssh -p 23456 root@region-9.example.com" --identity ~/.ssh/id_ed25519 --trust
      AUTODL_PW=... orch hosts add a100 --ssh "ssh -p 40022 root@connect.example.com" \\
          --password-env AUTODL_PW --preset autodl --trust --price-per-hour 1.98
      AUTODL_PW=... orch hosts add a100 --ssh "ssh -p 40022 root@connect.example.com" \\
          --password-env AUTODL_PW --install-key --trust     # from then on: the key, no password
      orch hosts add lab --ssh "ssh alice@login.lab.example.edu" --identity ~/.ssh/id_ed25519 \\
          --scheduler slurm --partition gpu --account proj123 --trust
      orch hosts add a100 --provider autodl --instance 4a1c... --token-env AUTODL_TOKEN --preset autodl
    """
    if install_key and not password_env:
        raise UsageError("--install-key logs in once with a password: add --password-env VAR")
    if key is not None and not install_key:
        raise UsageError("--key goes with --install-key (for a key you already use: --identity FILE)")
    if name == LOCAL:
        raise UsageError("`local` is built in")
    if password_env is not None and not ENV_KEY_RE.match(password_env):
        raise UsageError(f"--password-env wants a variable NAME (like AUTODL_PW), got {password_env!r}")
    fields = entry.address(ssh_command, provider, instance, token_env, api_url, password_env, install_key)
    env_pairs = [item.partition("=") for item in slurm_env]
    if any(not sep or not ENV_KEY_RE.match(k) for k, sep, _ in env_pairs):
        raise UsageError(f"--slurm-env wants NAME=VALUE (like SLURM_CONF=/etc/slurm/lab.conf), got {slurm_env!r}")
    if identity:
        fields["identity_file"] = identity
    old = app.inventory.get(name) if (app.inventory.dir / f"{name}.json").is_file() else None
    host = entry.new_entry(name, root=root, python=python, presets=presets, password_env=password_env,
                           price_per_hour=price_per_hour, idle_shutdown_minutes=idle_shutdown_minutes,
                           gc_keep_days=gc_keep_days,
                           scheduler=scheduler, partition=partition, account=account, qos=qos,
                           slurm_env={k: v for k, _, v in env_pairs}, **fields)
    if old is not None and old.host_key:
        host = host.model_copy(update={"host_key": enroll.kept_key(old, host, keep_key=keep_key, pin=trust,
                                                                   confirm=_confirm_kept, say=app.say)})
    if trust or install_key:
        host = enroll.verify(host, app.inventory, app.say, had_entry=old is not None, pin=trust,
                             install_key=install_key, key=key, hello=_hello)
    app.inventory.save(host)
    app.say(f"saved {name}: {host.target}, root {host.root}" + (" (Slurm login node)" if host.slurm else ""))
    if host.host_key is None:
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
    enroll.trust(host, app.inventory, app.say, save=True, hello=_hello)


@hosts_group.command("check")
@click.argument("name")
@pass_app
def check_cmd(app: App, name: str) -> None:
    """Preflight a host: login shell, python, torch/CUDA, GPUs, driver, disk and inodes,
    rsync/tmux, clock skew, and orch's own disk use there by class (a warning when the data
    disk is over 90 % used: `orch gc` frees it). A table with a verdict per line; exit 4 on a
    blocker.

    \b
    Example:
      orch hosts check box
    """
    host = app.inventory.get(name)
    if host.provider is not None and not instance_ready(host, app.say):  # its state, price, release said
        return
    preflight_hosts([host], app.inventory, Needs(), lambda host, rows: app.out.print(table(host, rows)), usage=True)


@hosts_group.command("ls")
@click.option("--json", "as_json", is_flag=True, help="One object per host (provider hosts: state, price, release).")
@pass_app
def ls_cmd(app: App, as_json: bool) -> None:
    """List hosts; a provider host also with its state, price per hour and, when powered off,
    days until the provider releases it (asked of the provider now)."""
    from orchestrator.access.provisioned import facts

    good, broken = app.inventory.survey()  # a broken entry is flagged, never hides the others
    rented = {host.name: facts(host) for host in good if host.provider is not None}
    if as_json:
        app.json([{"name": h.name, "target": h.target, "root": h.root, "key_pinned": bool(h.host_key),
                   **({"provider": rented[h.name]} if h.name in rented else {})}
                  for h in [app.inventory.local(), *good]] + [{"name": n, "broken": str(e)} for n, e in broken.items()])
        return
    table = Table(box=None, pad_edge=False)
    for column in ("NAME", "TARGET", "ROOT", "PYTHON", "AUTH", "KEY"):
        table.add_column(column)
    for host in [app.inventory.local(), *good]:
        auth = "-" if host.kind == "local" else (f"${host.password_env}" if host.password_env else
                                                  f"${host.provider.token_env} (API)" if host.provider else
                                                  (host.identity_file or "agent/default keys"))
        key = "-" if host.kind == "local" else ("pinned" if host.host_key else "NOT PINNED")
        table.add_row(*(Text(str(cell)) for cell in (host.name, host.target, host.root, host.python, auth, key)))
    for name in broken:
        table.add_row(*(Text(cell) for cell in (name, "BROKEN (see below)", "-", "-", "-", "-")))
    app.out.print(table)
    if rented:
        app.out.print(_rented_table(rented))
    for error in broken.values():
        app.say(f"warning: {error}")
    for name, row in rented.items():
        if "error" in row:
            app.say(f"warning: {name}: {row['error']}")


def _rented_table(rented: dict[str, dict[str, object]]) -> Table:
    """Provider hosts: NAME PROVIDER STATE PRICE/H RELEASE (days until a powered-off one goes)."""
    table = Table(box=None, pad_edge=False)
    for column in ("NAME", "PROVIDER", "STATE", "PRICE/H", "RELEASE"):
        table.add_column(column)
    for name, row in rented.items():
        price = row.get("price_per_hour")
        left = row.get("release_in_days")
        table.add_row(*(Text(str(cell)) for cell in (
            name, row["provider"], row["state"], "-" if price is None else f"{price:g} {row['currency']}",
            "-" if left is None else f"in {left:.1f} d")))
    return table


@hosts_group.command("disconnect")
@click.argument("name", required=False)
@pass_app
def disconnect_cmd(app: App, name: str | None) -> None:
    """Close the SSH connection orch keeps warm for NAME (every host without NAME).

    The next command connects directly and starts a new one (docs/connections.md).
    """
    from orchestrator.holder.spawn import stop_holders

    target = None
    if name is not None:
        host = app.inventory.get(name)
        if host.kind == "local":
            raise UsageError("`local` has no connection to close")
        target = host.target
    count = stop_holders(app.inventory.home, target)
    app.say(f"closed {count} kept connection{'' if count == 1 else 's'}")


@hosts_group.command("rm")
@click.argument("name")
@pass_app
def rm_cmd(app: App, name: str) -> None:
    """Remove a host from the inventory (its files on the server stay)."""
    app.inventory.remove(name)
    app.say(f"removed {name}")


COMMANDS = [hosts_group]

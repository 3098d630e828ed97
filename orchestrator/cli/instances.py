"""``orch instances``: every instance each provider account holds, set against the host
entries (``providers/accounts.py``), with the commands that add, power off or release each."""

from __future__ import annotations

import click

from orchestrator.cli.app import App, pass_app
from orchestrator.display.progress import duration
from orchestrator.display.table import Column, fit, width_for
from orchestrator.providers.accounts import Holding, Listed, accounts_for, list_accounts, raise_failures
from orchestrator.providers.registry import NAMES
from orchestrator.termtext import clean

UNKNOWN = "billing, unknown to orch"
COLUMNS = [Column("ACCOUNT", 1, required=True), Column("INSTANCE", 0, required=True),
           Column("STATE", 2, required=True), Column("PRICE", 3, right=True), Column("AGE", 4, right=True),
           Column("HOST", 1, required=True), Column("GPU", 5, min_width=8), Column("LABEL", 6, min_width=8)]


def _state(item: Listed) -> str:
    found = item.instance
    return found.state + (f" ({found.status})" if found.status and found.status != found.state else "")


def _row(holding: Holding, item: Listed) -> list[str]:
    found = item.instance
    price = f"{found.price_per_hour:g} {found.currency}/h".strip() if found.price_per_hour is not None else "?"
    host = item.host or (UNKNOWN if item.billing else "unknown to orch")
    return [holding.account.key, found.id, _state(item), price,
            duration(item.age_s) or "?", host, found.gpu, found.label]


def _todo(item: Listed) -> list[str]:
    """What to run for one instance, a line or four."""
    found, do = item.instance, item.commands
    off = do.power_off or "already off"
    if item.host:
        return [f"{found.id} ({item.host}): power off: {off} · release: {do.release}"]
    lines = [f"{found.id}, {UNKNOWN if item.billing else 'unknown to orch'}:", f"  add:       {do.add}",
             f"  power off: {off}", f"  release:   {do.release}"]
    return lines + ([f"  by hand:   {do.console}"] if do.console else [])


def lines_of(holdings: list[Holding], width: int | None) -> list[str]:
    """The table of every listed instance, a line per account that listed none or failed,
    then what to run for each instance."""
    rows = [[clean(cell) for cell in _row(h, item)] for h in holdings for item in h.instances]
    out = fit(COLUMNS, rows, width) if rows else []
    for h in holdings:
        if h.not_supported:
            out.append(f"{h.account.key}: {clean(h.error)} (not supported)")
        elif h.error:
            out.append(f"{h.account.key}: error: {clean(h.error)}")
        elif not h.instances:
            out.append(f"{h.account.key}: no instances")
    todo = [clean(line) for h in holdings for item in h.instances for line in _todo(item)]
    return out + ([""] + todo if todo else [])


@click.command("instances")
@click.option("--provider", type=click.Choice(NAMES), default=None,
              help="List this provider's account only (with --token-env; default: every account the host "
                   "entries name).")
@click.option("--token-env", metavar="VAR", default=None,
              help="The variable holding that account's token (default: the provider's usual one, e.g. "
                   "VAST_API_KEY).")
@click.option("--api-url", metavar="URL", default=None, help="That account's API (default: the provider's own).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: a list of accounts, each with its instances.")
@click.option("--wide", is_flag=True, help="Every column, however wide.")
@pass_app
def instances_cmd(app: App, provider: str | None, token_env: str | None, api_url: str | None, as_json: bool,
                  wide: bool) -> None:
    """List every instance each provider account holds, with state, price and age, marking
    those no host entry names ("billing, unknown to orch" when they bill), and the command
    that adds, powers off or releases each.

    The accounts are those the provider host entries name (provider, token variable and
    API, each once), or the one given with --provider. An account that cannot be listed (its
    token unset or refused, its API down) is one line with the provider's words while the
    others are still listed; the exit code is then that account's (2 token variable unset, 3
    token refused or API unreachable, 4 refused by the provider), else 0. A provider orch
    cannot list instances of is said so in one line.

    \b
    Examples:
      orch instances
      orch instances --provider vast --token-env VAST_API_KEY
      orch instances --json
    """
    hosts, _ = app.inventory.survey()
    accounts = accounts_for(hosts, provider, token_env, api_url)
    holdings = list_accounts(accounts, hosts)
    if as_json:
        app.json([h.as_json() for h in holdings])
    elif not accounts:
        click.echo("no provider accounts: no host entry names a provider; list one with "
                   "orch instances --provider NAME --token-env VAR")
    else:
        click.echo("\n".join(lines_of(holdings, width_for(wide))))
    raise_failures(holdings)


COMMANDS = [instances_cmd]

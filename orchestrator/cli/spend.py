"""``orch spend [--month YYYY-MM] [--json]``: this month's cost of orch's jobs per host and per
provider, from the laptop's records (``jobs/spend.py``), and each provider account's balance."""

from __future__ import annotations

import click

from orchestrator.cli.app import App, pass_app
from orchestrator.display.table import Column, fit, width_for
from orchestrator.termtext import clean

HOST_COLUMNS = [Column("HOST", 0, required=True), Column("PROVIDER", 3), Column("JOBS", 2, right=True),
                Column("HOURS", 1, right=True), Column("PRICE/H", 4, right=True), Column("COST", 0, right=True,
                                                                                       required=True)]
PROVIDER_WORDS = {"": "-", "?": "? (entry removed)"}  # a plain host; a host whose entry is gone


def money(amount: float | None, currency: str) -> str:
    """``2.48 CNY``, ``0.31`` (a plain host names no currency), ``-`` when unknown."""
    return "-" if amount is None else f"{amount:.2f}" + (f" {currency}" if currency else "")


@click.command("spend")
@click.option("--month", default=None, metavar="YYYY-MM", help="The month to sum (default: this one, local time).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: hosts, providers, balances.")
@pass_app
def spend_cmd(app: App, month: str | None, as_json: bool) -> None:
    """Show this month's cost of orch's jobs per host and per provider (from the laptop's
    records: prices and run times) and each provider account's balance where it reports one.

    No host is asked. A job's cost is what `orch status` shows as COST; a job on a host without a price counts
    its hours only. Run `orch status` first to bring unfinished jobs' records up to date.

    \b
    Examples:
      orch spend
      orch spend --month 2026-11 --json
    """
    from orchestrator.jobs.spend import provider_balance, spend

    found = spend(app.registry.all(), app.inventory, month, balance_of=provider_balance)
    if as_json:
        app.json(found.as_json())
        return
    if not found.hosts:
        click.echo(f"{found.month}: no orch job ran in this month")
    else:
        click.echo(f"{found.month}: {len(found.jobs)} job(s)")
        cells = [[clean(h.host), PROVIDER_WORDS.get(h.provider, h.provider), str(h.jobs),
                  f"{h.hours:.2f}", money(h.price_per_hour, h.currency),
                  money(h.cost, h.currency) + (f" + {h.unpriced_jobs} unpriced" if h.unpriced_jobs and h.cost else "")]
                 for h in found.hosts]
        click.echo("\n".join(fit(HOST_COLUMNS, cells, width_for(False))))
        for p in found.providers:
            click.echo(f"{p.provider or 'own hosts'}: {money(p.cost, p.currency)} ({', '.join(p.hosts)})")
        if found.unfinished:
            click.echo(f"{found.unfinished} unfinished job(s) as last recorded, counted until now "
                       "(orch status updates their records)")
    for b in found.balances:
        head = f"balance {b.provider} (${b.token_env}" + (f", {b.api_url}" if b.api_url else "") + "): "
        click.echo(clean(head + (money(b.amount, b.currency) if b.amount is not None else b.note)))


COMMANDS = [spend_cmd]

"""``orch gc HOST``."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from orchestrator.access.connect import open_transport
from orchestrator.ask import confirm
from orchestrator.cli.app import App, pass_app
from orchestrator.errors import UsageError
from orchestrator.helper.remote import Remote
from orchestrator.jobs import reclaim
from orchestrator.termtext import size_text
from orchestrator.transport.base import never


@click.command("gc")
@click.argument("host")
@click.option("--dry-run", is_flag=True, help="List what would be removed and what it frees; remove nothing.")
@click.option("-y", "--yes", is_flag=True, help="Do not ask (scripts).")
@click.option("--keep-days", type=click.FloatRange(min=0), default=reclaim.KEEP_DAYS, show_default=True, metavar="N",
              help="Keep finished jobs that ended, and workspaces and superseded attempts touched, within N days.")
@click.option("--keep", type=click.IntRange(min=0), default=reclaim.KEEP, show_default=True, metavar="N",
              help="Keep the N newest finished jobs of each workspace, whatever their age.")
@click.option("--all-finished", is_flag=True,
              help="Finished jobs whose outputs this laptop has not fetched may go too (by the same rule).")
@click.option("--json", "as_json", is_flag=True, help="One object: the items removed (or listed), bytes, what stayed.")
@pass_app
def gc_cmd(app: App, host: str, dry_run: bool, yes: bool, keep_days: float, keep: int, all_finished: bool,
           as_json: bool) -> None:
    """Remove what orch keeps on HOST that nothing needs any more, and say what it frees.

    Finished job folders whose outputs this laptop fetched and verified (`orch fetch`; with
    --all-finished, any finished job's) beyond the retention rule; payloads of other orch
    versions that nothing on the host runs; workspaces not synced for --keep-days (never the
    current checkout's, never one an unfinished job came from); superseded attempts of moved
    jobs; staged code no launch took; orch's temporaries. Never a queued, running or
    unfinished job's folder, nor anything a sync or a launch holds: the host decides under
    the same locks. Asks first; --yes for scripts, --dry-run to only list.

    \b
    Examples:
      orch gc box --dry-run
      orch gc box --keep-days 0 --keep 1
      orch gc box --all-finished --yes
    """
    target = app.inventory.get(host)
    rule = reclaim.Rule(keep_days=keep_days, keep=keep, all_finished=all_finished)
    projects = reclaim.checkout_projects(Path.cwd())
    with open_transport(target, app.inventory, never) as transport:
        remote = Remote(target, transport)
        listing = reclaim.ask(remote, app.registry, rule, projects, dry_run=True)
        if dry_run or not listing.items:
            _show(app, listing, as_json, "would free" if listing.items else "")
            return
        if not yes:
            if not as_json:
                _show(app, listing, False, "would free")
            answer = confirm(f"Remove these {len(listing.items)} from {host} ({size_text(listing.total)})?", default=False)
            if answer is None:
                raise UsageError(f"orch gc removes files on {host}: confirm at a terminal, or run it with --yes "
                                 f"(--dry-run lists them)")
            if not answer:
                raise UsageError(f"nothing removed from {host}")
        done = reclaim.ask(remote, app.registry, rule, projects, dry_run=False,
                           only=[item.name for item in listing.items])
    _show(app, done, as_json, "freed")
    left = {item.name for item in listing.items} - {item.name for item in done.items}
    if left and not as_json:
        app.say(f"{len(left)} listed item(s) stayed: they changed since (a job resumed, a sync started)")


def _show(app: App, listing: reclaim.Listing, as_json: bool, verb: str) -> None:
    if as_json:
        app.json(listing.as_json())
        return
    if listing.items:
        table = Table(box=None, pad_edge=False)
        for column in ("CLASS", "NAME", "SIZE", "NOTE"):
            table.add_column(column)
        for item in listing.items:
            when = f" {time.strftime('%Y-%m-%d %H:%M', time.localtime(item.at))}" if item.at is not None else ""
            table.add_row(*(Text(cell) for cell in (item.kind, item.name, size_text(item.bytes), item.note + when)))
        app.out.print(table)
        click.echo(f"{listing.host}: {verb} {listing.summary()}")
    else:
        click.echo(f"{listing.host}: nothing to remove")
    if listing.kept_line():
        click.echo(listing.kept_line())


COMMANDS = [gc_cmd]

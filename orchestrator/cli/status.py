"""``orch status`` / ``orch ls``.

The table fits the terminal (``progress.status_lines``): on a terminal its width, when
piped the ``COLUMNS`` environment variable; piped without ``COLUMNS``, or with ``--wide``,
everything (full job ids, every column) so scripts get whole rows.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict
from functools import lru_cache
from typing import Any

import click
from rich.live import Live
from rich.text import Text

from orchestrator import jobs
from orchestrator.cli.app import App, pass_app
from orchestrator.errors import OrchError, UsageError
from orchestrator.progress import JobProgress, StatusRow, row_fields, status_lines
from orchestrator.spec import load_spec
from orchestrator.termtext import clean

def refresh(app: App, records: list[Any]) -> dict[str, dict[str, Any]]:
    """Statuses from the hosts (one connection per host; nodes aggregated), see jobs.refresh."""
    return jobs.refresh(records, app.inventory, app.registry, app.say)


@lru_cache(maxsize=256)
def _total_steps(spec_path: str) -> int | None:
    """``train.max_steps`` from the job's spec file, when it is still there and readable
    (read once per process: ``status -w`` refreshes often)."""
    try:
        train = load_spec(spec_path).spec.train
    except (OrchError, OSError):
        return None
    return train.max_steps if train is not None else None


def _price(app: App, record: Any) -> float | None:
    prices = []
    for name in record.hosts:
        try:
            prices.append(app.inventory.get(name).price_per_hour)
        except UsageError:
            return None
    return None if any(p is None for p in prices) else sum(prices) / max(len(prices), 1)


def progress_of(app: App, record: Any, status: dict[str, Any]) -> JobProgress:
    nodes = status.get("nodes")
    count = len(nodes) if isinstance(nodes, (list, dict)) and nodes else len(record.hosts)
    return row_fields(status, record.created, count, _total_steps(record.spec_path), _price(app, record))


def width_for(app: App, wide: bool) -> int | None:
    """The width to fit ``orch status`` to: None (everything) for ``--wide`` or when piped
    without ``COLUMNS``; the console's width on a terminal (rich reads ``COLUMNS`` or
    asks the terminal, each time: ``-w`` follows a resize)."""
    if wide:
        return None
    if sys.stdout.isatty():
        return app.out.width
    columns = os.environ.get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else None


def _table(app: App, records: list[Any], statuses: dict[str, dict[str, Any]], known_ids: list[str],
           width: int | None) -> Text:
    rows = [StatusRow(r.job_id, progress_of(app, r, statuses[r.job_id]), r.hosts,
                      clean(str(statuses[r.job_id].get("reason") or ""))) for r in records]
    header, *lines = status_lines(rows, width, known_ids)
    text = Text()
    text.append(header, style="bold")
    for line in lines:
        text.append("\n" + line)
    return text


@click.command("status")
@click.argument("job", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object for JOB, a list otherwise).")
@click.option("-w", "--watch", is_flag=True, help="Refresh in place until Ctrl-C.")
@click.option("--wide", is_flag=True, help="Full job ids and every column, however wide.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="Seconds between refreshes with --watch.")
@click.option("--iterations", type=click.IntRange(min=1), default=None, hidden=True,
              help="Stop --watch after N refreshes (tests).")
@pass_app
def status_cmd(app: App, job: str | None, as_json: bool, watch: bool, wide: bool, interval: float,
               iterations: int | None) -> None:
    """Show jobs: state, nodes, step/total, loss, tokens/s, ETA, elapsed, and a cost
    estimate for hosts with a price (orch hosts add ... --price-per-hour).

    The table fits the terminal: job ids are shortened to their shortest unique prefix
    (usable with every command) and the least important columns are left out; --wide
    shows full ids and every column.

    \b
    Examples:
      orch status
      orch status -w
      orch status --wide
      orch status gpt2-lora-20261129-101500-1a2b --json
    """
    records = [app.registry.get(job)] if job else app.registry.all()
    if as_json:
        statuses = refresh(app, records)
        items = [dict(statuses[r.job_id], hosts=r.hosts, job_dir=r.job_dir, name=r.name,
                      progress=asdict(progress_of(app, r, statuses[r.job_id]))) for r in records]
        app.json(items[0] if job else items)
        return
    if not records:
        click.echo("no jobs yet: orch submit JOB.yaml")
        return
    known_ids = [r.job_id for r in app.registry.all()] if job else [r.job_id for r in records]
    if not watch:
        app.out.print(_table(app, records, refresh(app, records), known_ids, width_for(app, wide)))
        return
    done = 0
    try:
        with Live(console=app.out, auto_refresh=False) as live:
            while True:
                table = _table(app, records, refresh(app, records), known_ids, width_for(app, wide))
                live.update(table, refresh=True)
                done += 1
                if iterations is not None and done >= iterations:
                    break
                time.sleep(interval)
    except KeyboardInterrupt:
        pass  # stop watching; jobs are untouched


@click.command("ls")
@click.option("--json", "as_json", is_flag=True)
@click.option("--wide", is_flag=True, help="Full job ids and every column, however wide.")
@click.pass_context
def ls_cmd(ctx: click.Context, as_json: bool, wide: bool) -> None:
    """List all jobs (same as `orch status`)."""
    ctx.invoke(status_cmd, job=None, as_json=as_json, watch=False, wide=wide, interval=2.0, iterations=None)


COMMANDS = [status_cmd, ls_cmd]

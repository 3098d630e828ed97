"""``orch status`` / ``orch ls``.

The table fits the terminal (``progress.status_lines``): on a terminal its width, when
piped the ``COLUMNS`` environment variable; piped without ``COLUMNS``, or with ``--wide``,
everything (full job ids, every column) so scripts get whole rows.

Finished jobs cost nothing: a job recorded as terminal (``registry.TERMINAL``) is never asked
about again, and its row is the final row recorded when a status first saw it terminal
(``Registry.record_final``; made then from the recorded status, the spec's step total and the
host's price). When every listed job is such a job, ``orch status`` connects to no host and
loads neither the job/host modules (pydantic, paramiko) nor rich: it reads the registry and
writes plain text.

A host that cannot be asked never hides the others: an unreachable SSH host's jobs show their
last known state marked ``(stale)``, and so do a provider host's when its provider refuses the
token or does not answer, with the provider's words as their reason (and ``provider_error`` in
``--json``); each is said once as a ``warning:`` line and the exit code stays 0. Once a day,
when a provider account whose hosts it asks holds a billing instance no host entry names, a
``warning:`` line says so (``orch instances`` lists them).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from orchestrator.cli.app import App, notify_option, pass_app
from orchestrator.display.progress import JobProgress, StatusRow, detail_lines, status_lines
from orchestrator.display.table import width_for
from orchestrator.errors import UsageError
from orchestrator.controller import laptop
from orchestrator.home import orch_home
from orchestrator.jobs import overview
from orchestrator.state.registry import JobRecord
from orchestrator.termtext import clean

if TYPE_CHECKING:
    from rich.text import Text

def refresh(app: App, records: list[JobRecord]) -> dict[str, dict[str, Any]]:
    """Statuses (``jobs/overview.py``: ``refresh``; finished jobs from the registry alone), with
    the daily word on a billing instance no host entry names."""
    return overview.refresh(records, lambda: app.inventory, app.registry, app.say, watch_billing=True)


def managed_jobs(app: App, records: list[JobRecord]) -> dict[str, dict[str, Any]]:
    """The managed jobs among ``records`` (docs/managed.md), their controller asked when one
    is not finished: a job it moved is moved in the registry here too."""
    if not laptop.managed(orch_home(), [r.job_id for r in records]):
        return {}
    return laptop.refresh(app.inventory, app.registry, [r.job_id for r in records], app.say)


def progress_of(app: App, record: JobRecord, status: dict[str, Any]) -> JobProgress:
    """The row's columns (``jobs/overview.py``: ``progress_of``)."""
    return overview.progress_of(record, status, lambda: app.inventory, app.registry)


def _lines(app: App, records: list[JobRecord], statuses: dict[str, dict[str, Any]], known_ids: list[str],
           width: int | None, single: bool = False) -> list[str]:
    """The table; for one job asked by name (``single``) its row without REASON, and under
    it the whole reason and any note (``progress.detail_lines``)."""
    rows = [StatusRow(r.job_id, progress_of(app, r, statuses[r.job_id]), r.hosts,
                      clean(str(statuses[r.job_id].get("reason") or ""))) for r in records]
    if not single:
        return status_lines(rows, width, known_ids)
    details = [line for row in rows for line in detail_lines(row, width)]
    return status_lines(rows, width, known_ids, reasons=False) + details


def _text(lines: list[str]) -> Text:
    """The table for rich (``-w``), its header bold."""
    from rich.text import Text

    header, *rest = lines
    text = Text()
    text.append(header, style="bold")
    for line in rest:
        text.append("\n" + line)
    return text


def _print(lines: list[str]) -> None:
    """The table as plain text; the header bold on a terminal that shows styles."""
    header, *rest = lines
    if sys.stdout.isatty() and os.environ.get("TERM", "") not in ("dumb", "unknown"):
        header = f"\x1b[1m{header}\x1b[0m"
    sys.stdout.write("".join(f"{line}\n" for line in [header, *rest]))
    sys.stdout.flush()


@click.command("status")
@click.argument("job", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object for JOB, a list otherwise).")
@click.option("-w", "--watch", is_flag=True, help="Refresh in place until Ctrl-C.")
@notify_option
@click.option("--wide", is_flag=True, help="Full job ids and every column, however wide.")
@click.option("--sweep", metavar="NAME", default=None,
              help="One row per combination of sweep NAME (orch submit --sweep): its values, state, best eval loss, "
                   "final train loss, step, host.")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True,
              help="Seconds between refreshes with --watch.")
@click.option("--iterations", type=click.IntRange(min=1), default=None, hidden=True,
              help="Stop --watch after N refreshes (tests).")
@pass_app
def status_cmd(app: App, job: str | None, as_json: bool, watch: bool, wide: bool, interval: float,
               iterations: int | None, sweep: str | None = None) -> None:
    """Show jobs: state, nodes, step/total, loss, tokens/s, ETA, elapsed, and a cost
    estimate for hosts with a price (orch hosts add ... --price-per-hour).

    The table fits the terminal: job ids are shortened to their shortest unique prefix
    (usable with every command), reasons cut with "…" and the least important columns
    left out; --wide shows full ids and every column. For one JOB the whole reason is
    printed under its row. ELAPSED counts from the first attempt's start; a resumed job
    whose script began again from an earlier step shows "(started over)".

    \b
    Examples:
      orch status
      orch status -w
      orch status --wide
      orch status gpt2-lora-20261129-101500-1a2b --json
      orch status --sweep gpt2-lora-sweep-20261129-101500
    """
    if job and sweep is not None:
        raise UsageError("give JOB or --sweep NAME, not both")
    from orchestrator.sweep import status as sweepstatus  # light: the registry and the table only

    found = sweepstatus.members(app.registry, sweep) if sweep is not None else None
    records = [r for r, _ in found] if found is not None else [app.registry.get(job)] if job else app.registry.all()
    managed = managed_jobs(app, records)
    if managed:
        records = [app.registry.get(r.job_id) for r in records]  # a job its controller moved: where it is now
    if as_json:
        statuses = refresh(app, records)
        if found is not None and sweep is not None:
            rows = sweepstatus.rows_for(app, found, statuses, progress_of, Path("runs"))
            app.json(sweepstatus.as_json(found, rows, sweep))
            return
        items = [overview.status_json(r, statuses[r.job_id], progress_of(app, r, statuses[r.job_id])) for r in records]
        for item in items:
            if item["job_id"] in managed:
                item["managed"] = managed[item["job_id"]]
        app.json(items[0] if job else items)
        return
    if not records:
        click.echo("no jobs yet: orch submit JOB.yaml")
        return
    known_ids = [r.job_id for r in app.registry.all()] if job or found else [r.job_id for r in records]

    def render(statuses: dict[str, dict[str, Any]]) -> list[str]:
        if found is not None:  # one row per combination of the sweep
            rows = sweepstatus.rows_for(app, found, statuses, progress_of, Path("runs"))
            return sweepstatus.sweep_lines(sweepstatus.keys_of(found), rows, width_for(wide), known_ids,
                                           sweepstatus.combinations_of(found))
        return _lines(app, records, statuses, known_ids, width_for(wide), single=bool(job)) + [
            f"{r.job_id}: {laptop.words(managed[r.job_id])}" for r in records if r.job_id in managed]

    if not watch:
        _print(render(refresh(app, records)))
        return
    from rich.live import Live

    from orchestrator.display.notify import Transitions

    done, seen = 0, Transitions()
    try:
        with Live(console=app.out, auto_refresh=False) as live:
            while True:
                statuses = refresh(app, records)
                table = _text(render(statuses))
                live.update(table, refresh=True)
                for ended in seen.ended(statuses):  # a job seen running that has now ended
                    app.job_ended(ended, statuses[ended])
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

"""``orch status`` / ``orch ls``."""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import click
from rich.table import Table

from orchestrator.cli.app import App, pass_app
from orchestrator.connect import never, open_transport
from orchestrator.errors import HostError, UsageError
from orchestrator.registry import SUBMITTING
from orchestrator.remote import Remote
from orchestrator.termtext import clean

TERMINAL = ("succeeded", "failed", "cancelled")


def refresh(app: App, records: list[Any]) -> dict[str, dict[str, Any]]:
    """Ask each host once about its jobs that are not finished; keep the registry's word for
    finished jobs and for hosts that cannot be reached (marked ``stale``)."""
    out = {r.job_id: dict(r.detail, state=r.state, job_id=r.job_id) for r in records}
    by_host: dict[str, list[str]] = defaultdict(list)
    for r in records:
        if r.state not in TERMINAL:
            by_host[r.hosts[0]].append(r.job_id)
    for host_name, ids in by_host.items():
        try:
            host = app.inventory.get(host_name)
            with open_transport(host, app.inventory, never) as transport:
                jobs = Remote(host, transport).call("status", *ids)["jobs"]
        except (HostError, UsageError) as exc:
            app.say(f"warning: {exc}".splitlines()[0])
            for job_id in ids:
                out[job_id]["stale"] = True
            continue
        for job_id in ids:
            status = jobs.get(job_id)
            if out[job_id]["state"] == SUBMITTING and isinstance(status, dict) and status.get("state") == "unknown":
                out[job_id]["reason"] = "submit was interrupted before launch: run the same orch submit again"
                continue
            if isinstance(status, dict) and isinstance(status.get("state"), str):
                app.registry.update(job_id, status["state"], status)
                out[job_id] = dict(status, job_id=job_id)
    return out


def _row(record: Any, status: dict[str, Any]) -> list[str]:
    metrics = status.get("metrics") if isinstance(status.get("metrics"), dict) else {}
    loss = metrics.get("loss")
    ended = status.get("ended") if isinstance(status.get("ended"), (int, float)) else time.time()
    started = status.get("started") if isinstance(status.get("started"), (int, float)) else record.created
    state = str(status.get("state")) + (" (stale)" if status.get("stale") else "")
    return [record.job_id, state, ",".join(record.hosts), clean(str(metrics.get("step", ""))),
            f"{loss:.4f}" if isinstance(loss, (int, float)) else "", f"{max(ended - started, 0):.0f}s",
            clean(str(status.get("reason") or ""))[:60]]


@click.command("status")
@click.argument("job", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one object for JOB, a list otherwise).")
@pass_app
def status_cmd(app: App, job: str | None, as_json: bool) -> None:
    """Show jobs and their states (pending, setting_up, running, succeeded, failed, cancelled, lost).

    \b
    Examples:
      orch status
      orch status gpt2-lora-20261129-101500-1a2b --json
    """
    records = [app.registry.get(job)] if job else app.registry.all()
    statuses = refresh(app, records)
    if as_json:
        items = [dict(statuses[r.job_id], hosts=r.hosts, job_dir=r.job_dir, name=r.name) for r in records]
        app.json(items[0] if job else items)
        return
    if not records:
        click.echo("no jobs yet: orch submit JOB.yaml")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("JOB", "STATE", "HOST", "STEP", "LOSS", "ELAPSED"):
        table.add_column(column, no_wrap=True)
    table.add_column("REASON")
    for r in records:
        table.add_row(*_row(r, statuses[r.job_id]))
    app.out.print(table)


@click.command("ls")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def ls_cmd(ctx: click.Context, as_json: bool) -> None:
    """List all jobs (same as `orch status`)."""
    ctx.invoke(status_cmd, job=None, as_json=as_json)


COMMANDS = [status_cmd, ls_cmd]

"""``orch rm JOB``."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import click

from orchestrator.access.connect import open_transport
from orchestrator.cli.app import App, pass_app
from orchestrator.errors import UsageError
from orchestrator.helper.remote import Remote
from orchestrator.jobs import reclaim
from orchestrator.jobs.nodes import nodes_of
from orchestrator.termtext import size_text
from orchestrator.transport.base import never


@click.command("rm")
@click.argument("job")
@click.option("--local", "local_record", is_flag=True,
              help="Also forget the job on this laptop (its record; fetched files stay where they are).")
@pass_app
def rm_cmd(app: App, job: str, local_record: bool) -> None:
    """Remove a finished job's folder on its host (every node's), keeping its record here.

    Refused for a job that is not finished (queued, running, lost: cancel it first) or
    whose supervisor still runs; nothing is removed then. With --local the laptop's record
    goes too, and `orch status` no longer lists the job.

    \b
    Examples:
      orch rm gpt2-lora-20261129-101500-1a2b
      orch rm gpt2-lora-20261129-101500-1a2b --local
    """
    record = app.registry.get(job)
    hosts = nodes_of(record, app.inventory)
    with ExitStack() as stack:
        remotes = [Remote(h, stack.enter_context(open_transport(h, app.inventory, never))) for h in hosts]
        rule, projects = reclaim.Rule(), reclaim.checkout_projects(Path.cwd())
        listings = [reclaim.ask(r, app.registry, rule, projects, dry_run=True, jobs=[record.job_id]) for r in remotes]
        refused = [f"{lst.host}: {why}" for lst in listings for why in lst.refused.values()]
        if refused:
            raise UsageError(f"{record.job_id} stays: " + "; ".join(refused)
                             + (" (orch cancel it first)" if any("unfinished" in r for r in refused) else ""))
        for remote, listing in zip(remotes, listings):
            if not listing.items:
                app.say(f"{remote.host.name}: no folder of {record.job_id} (removed already)")
                continue
            done = reclaim.ask(remote, app.registry, rule, projects, dry_run=False, jobs=[record.job_id])
            if done.refused:  # it changed since the look above (a resume)
                raise UsageError(f"{record.job_id} stays on {remote.host.name}: " + "; ".join(done.refused.values()))
            click.echo(f"{remote.host.name}: removed {record.job_id} ({size_text(done.total)} freed)")
    if local_record:
        app.registry.forget(record.job_id)
        click.echo(f"{record.job_id}: forgotten on this laptop")


COMMANDS = [rm_cmd]

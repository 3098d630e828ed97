"""``orch cancel``."""

from __future__ import annotations

import click

from orchestrator.cli.app import App, pass_app
from orchestrator.controller import laptop
from orchestrator.home import orch_home
from orchestrator.jobs.nodes import cancel, settle_fences
from orchestrator.termtext import clean
from remote_payload.contract.protocol import GRACE_S


@click.command("cancel")
@click.argument("job")
@click.option("--grace", type=click.FloatRange(min=0), default=GRACE_S, show_default=True,
              help="Seconds between SIGTERM (the trainer checkpoints) and SIGKILL.")
@pass_app
def cancel_cmd(app: App, job: str, grace: float) -> None:
    """Stop a job on every node: SIGTERM to all its processes (the trainer checkpoints),
    SIGKILL to what is left after the grace period.

    A moved job's attempt on a host it left that orch has not yet stopped is
    stopped too (when that host answers). A managed job's controller stops
    managing it first.

    \b
    Example:
      orch cancel gpt2-lora-20261129-101500-1a2b
    """
    record = app.registry.get(job)
    if laptop.managed(orch_home(), [record.job_id]):  # its controller stops managing it, then it stops where it runs now
        laptop.refresh(app.inventory, app.registry, [record.job_id], app.say, force=True)
        laptop.stop(app.inventory, record.job_id, app.say)
        record = app.registry.get(record.job_id)
    status = cancel(record, app.inventory, app.registry, grace)
    click.echo(f"{record.job_id}: {clean(str(status['state']))}")
    settle_fences([record.job_id], app.inventory, app.registry, app.say)  # an attempt it left behind, too


COMMANDS = [cancel_cmd]

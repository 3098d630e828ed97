"""``orch resume``."""

from __future__ import annotations

import click

from orchestrator.cli.app import App, pass_app
from orchestrator.cli.logs import follow_to_end
from orchestrator.jobs import resume


@click.command("resume")
@click.argument("job")
@click.option("-f", "--follow", is_flag=True, help="Stream the log; exit 0 if the job succeeds, 1 if not.")
@pass_app
def resume_cmd(app: App, job: str, follow: bool) -> None:
    """Relaunch a failed, lost or cancelled job in its own folder; the built-in trainer
    continues from its latest complete checkpoint.

    \b
    Example:
      orch resume gpt2-lora-20261129-101500-1a2b --follow
    """
    record = app.registry.get(job)
    resume(record, app.inventory, app.registry)
    app.say(f"resumed {record.job_id}")
    if follow and follow_to_end(app, record)["state"] != "succeeded":
        raise SystemExit(1)


COMMANDS = [resume_cmd]

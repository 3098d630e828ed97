"""``orch submit``."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import click

from orchestrator.checks import laptop_checks
from orchestrator.cli.app import App, pass_app
from orchestrator.cli.logs import report_new_job
from orchestrator.errors import UsageError
from orchestrator.launch import submit
from orchestrator.plan import plan_text
from orchestrator.spec import load_spec


@click.command("submit")
@click.argument("spec_file", type=click.Path(path_type=Path))
@click.option("-f", "--follow", is_flag=True, help="Stream the log; exit 0 if the job succeeds, 1 if not.")
@click.option("--dry-run", is_flag=True, help="Print the plan (job.json) and start nothing.")
@click.option("--force", is_flag=True, help="Overwrite files that were edited on the server.")
@click.option("--pull-remote-edits", is_flag=True,
              help="Copy files edited on the server (VSCode Remote) back into the local workspace first.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with job_id.")
@pass_app
def submit_cmd(app: App, spec_file: Path, follow: bool, dry_run: bool, force: bool, pull_remote_edits: bool,
               as_json: bool) -> None:
    """Validate, sync the workspace, set up and launch a job.

    \b
    Examples:
      orch submit jobs/tiny-lora-local.yaml --follow
      orch submit job.yaml --dry-run
      orch submit job.yaml --pull-remote-edits   # after editing on the server in VSCode
    """
    loaded = load_spec(spec_file)
    laptop_checks(loaded)  # the same checks as `orch check`, before connecting
    if force and pull_remote_edits:
        raise UsageError("--force overwrites the server's edits, --pull-remote-edits keeps them: choose one")
    with ExitStack() as connections:  # kept open for --follow: it reads the log on the same ones
        done = submit(loaded, app.inventory, app.registry, say=app.say, dry_run=dry_run, force=force,
                      pull_remote_edits=pull_remote_edits, keep=connections if follow else None)
        plan = done.plan
        if dry_run:
            click.echo(plan_text(plan))
            if plan.slurm is not None:  # the exact script sbatch gets, after the plan
                click.echo(f"# {plan.job_dir}/slurm.sh, submitted with sbatch on {plan.nodes[0].host}:")
                click.echo(plan.slurm["script"], nl=False)
            return
        result = {"job_id": plan.job_id, "hosts": [n.host for n in plan.nodes], "job_dir": plan.job_dir,
                  "state": "pending", "sync": done.sync_summary}
        report_new_job(app, plan.job_id, result, follow, as_json, done.remotes)


COMMANDS = [submit_cmd]

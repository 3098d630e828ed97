"""``orch submit``."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import click

from orchestrator.checks import laptop_checks
from orchestrator.cli.app import App, pass_app
from orchestrator.cli.fetch import watch_job
from orchestrator.cli.logs import report_new_job
from orchestrator.errors import UsageError
from orchestrator.launch import submit
from orchestrator.plan import plan_text
from orchestrator.spec import load_spec
from orchestrator.watch import DEFAULT_INTERVAL_S, Watch


@click.command("submit")
@click.argument("spec_file", type=click.Path(path_type=Path))
@click.option("-f", "--follow", is_flag=True, help="Stream the log; exit 0 if the job succeeds, 1 if not.")
@click.option("--dry-run", is_flag=True, help="Print the plan (job.json) and start nothing.")
@click.option("--force", is_flag=True, help="Overwrite files that were edited on the server.")
@click.option("--pull-remote-edits", is_flag=True,
              help="Copy files edited on the server (VSCode Remote) back into the local workspace first.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with job_id.")
@click.option("-w", "--watch", is_flag=True,
              help="Also keep runs/<job_id>/ current while the job runs (orch fetch JOB --watch: outputs, "
                   "metrics, logs, each new complete checkpoint); with --follow, while the log streams.")
@click.option("--watch-interval", type=click.FloatRange(min=0.05), default=DEFAULT_INTERVAL_S, show_default=True,
              metavar="SECONDS", help="With --watch: seconds between fetch rounds.")
@click.option("--keep-checkpoints", is_flag=True,
              help="With --watch: keep every checkpoint fetched (default: as many as the server keeps).")
@pass_app
def submit_cmd(app: App, spec_file: Path, follow: bool, dry_run: bool, force: bool, pull_remote_edits: bool,
               as_json: bool, watch: bool, watch_interval: float, keep_checkpoints: bool) -> None:
    """Validate, sync the workspace, set up and launch a job.

    \b
    Examples:
      orch submit jobs/tiny-lora-local.yaml --follow
      orch submit job.yaml --follow --watch      # stream the log, fetch checkpoints as they come
      orch submit job.yaml --dry-run
      orch submit job.yaml --pull-remote-edits   # after editing on the server in VSCode
    """
    loaded = load_spec(spec_file)
    laptop_checks(loaded)  # the same checks as `orch check`, before connecting
    if force and pull_remote_edits:
        raise UsageError("--force overwrites the server's edits, --pull-remote-edits keeps them: choose one")
    if (keep_checkpoints or watch_interval != DEFAULT_INTERVAL_S) and not watch:
        raise UsageError("--watch-interval and --keep-checkpoints go with --watch")
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
        if not watch:
            report_new_job(app, plan.job_id, result, follow, as_json, done.remotes)
            return
        if follow:  # the watch's rounds in a thread while the log streams, the final fetch after it
            watcher = Watch(app.registry.get(plan.job_id), app.inventory, app.registry, Path("runs"), app.say,
                            extra=["checkpoints/"], interval=watch_interval, keep_checkpoints=keep_checkpoints)
            with watcher.alongside():
                report_new_job(app, plan.job_id, result, follow, as_json, done.remotes)
            return
        report_new_job(app, plan.job_id, result, False, as_json, done.remotes)
    status = watch_job(app, app.registry.get(plan.job_id), Path("runs"), ["checkpoints/"], False, watch_interval,
                       keep_checkpoints)
    if status.get("state") != "succeeded":
        raise SystemExit(1)


COMMANDS = [submit_cmd]

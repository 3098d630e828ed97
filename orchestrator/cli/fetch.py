"""``orch fetch``."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.app import App, pass_app
from orchestrator.fetch import fetch


@click.command("fetch")
@click.argument("job")
@click.option("--dest", type=click.Path(path_type=Path), default=Path("runs"), show_default=True,
              help="Parent folder; files land in DEST/<job_id>/.")
@click.option("--checkpoints", is_flag=True, help="Also fetch checkpoints/.")
@click.option("--all", "everything", is_flag=True, help="Fetch every file of the job folder (not code/).")
@pass_app
def fetch_cmd(app: App, job: str, dest: Path, checkpoints: bool, everything: bool) -> None:
    """Download what the job's `outputs` select, verified by sha256; idempotent.

    \b
    Examples:
      orch fetch gpt2-lora-20261129-101500-1a2b
      orch fetch gpt2-lora --dest ~/runs --checkpoints
    """
    record = app.registry.get(job)
    summary = fetch(record, app.inventory, dest, app.say,
                    extra=["checkpoints/"] if checkpoints else [], everything=everything)
    click.echo(f"{summary.dest}: {len(summary.fetched)} fetched ({summary.bytes / 2**20:.1f} MB), "
               f"{len(summary.unchanged)} already there")


COMMANDS = [fetch_cmd]

"""``orch fetch``."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.app import App, pass_app
from orchestrator.errors import UsageError
from orchestrator.fetch import fetch, nothing_selected


@click.command("fetch")
@click.argument("job")
@click.option("--dest", type=click.Path(path_type=Path), default=Path("runs"), show_default=True,
              help="Parent folder; files land in DEST/<job_id>/.")
@click.option("--checkpoints", is_flag=True, help="Also fetch checkpoints/.")
@click.option("--include", "patterns", multiple=True, metavar="PATTERN",
              help="Also fetch what this gitignore-style pattern selects (repeatable).")
@click.option("--all", "everything", is_flag=True,
              help="Fetch every file of the job folder and every file the job wrote (not the synced code).")
@pass_app
def fetch_cmd(app: App, job: str, dest: Path, checkpoints: bool, patterns: tuple[str, ...],
              everything: bool) -> None:
    """Download what the job's `outputs` select, verified by sha256; idempotent.

    Patterns match both the job folder ($ORCH_JOB_DIR) and what the job wrote in its
    working directory, by the path it wrote: a script's `outputs/final` and
    `$ORCH_JOB_DIR/outputs/final` both land in DEST/<job_id>/outputs/final. A fetch that
    selects nothing says what the job folder holds, and exits 2 once the job has ended.

    \b
    Examples:
      orch fetch gpt2-lora-20261129-101500-1a2b
      orch fetch gpt2-lora --dest ~/runs --checkpoints
      orch fetch gpt2-lora --include 'results/' --include '*.pt'
    """
    record = app.registry.get(job)
    extra = (["checkpoints/"] if checkpoints else []) + list(patterns)
    summary = fetch(record, app.inventory, dest, app.say, extra=extra, everything=everything)
    if not summary.fetched and not summary.unchanged:
        message = nothing_selected(summary, record.job_id)
        if summary.ended:
            raise UsageError(message)
        app.say(message)
    click.echo(f"{summary.dest}: {len(summary.fetched)} fetched ({summary.bytes / 2**20:.1f} MB), "
               f"{len(summary.unchanged)} already there")


COMMANDS = [fetch_cmd]

"""``orch plot``."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator import runs
from orchestrator.cli.app import App, pass_app
from orchestrator.plot import read_metrics, save_plot, series


@click.command("plot")
@click.argument("job")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The PNG to write (default runs/<job id>/curves.png, beside what orch fetch writes; never synced).")
@click.option("--runs", "runs_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
              help="Where `orch fetch` put jobs: runs/<job id>/metrics.jsonl is used when present.")
@pass_app
def plot_cmd(app: App, job: str, output: Path | None, runs_dir: Path) -> None:
    """Draw loss (train and eval), lr and tokens/s against step into a PNG.

    Uses the fetched runs/<job>/metrics.jsonl, or the job's file on its host.
    Needs matplotlib (pip install matplotlib; from a clone: pip install '.[plot]').

    \b
    Examples:
      orch plot gpt2-lora
      orch plot gpt2-lora-20261129-101500-1a2b -o curves.png
    """
    record = app.registry.get(job)
    rows, source = read_metrics(record, app.inventory, runs_dir)
    out = output or runs.run_dir(runs_dir, record.job_id) / "curves.png"
    save_plot(rows, record.job_id, out)
    counts = ", ".join(f"{len(series(rows, k)[0])} {k}" for k in ("loss", "eval_loss", "lr", "tokens_per_s"))
    app.say(f"read {source}: {counts} points")
    click.echo(str(out))


COMMANDS = [plot_cmd]

"""``orch plot``."""

from __future__ import annotations

from pathlib import Path

import click

from orchestrator.cli.app import App, pass_app
from orchestrator.display.plot import legend_labels, overlay, read_metrics, save_figure, save_plot, series
from orchestrator.errors import UsageError
from orchestrator.state import runs
from orchestrator.sweep.status import members


@click.command("plot")
@click.argument("jobs", nargs=-1, metavar="[JOB]...")
@click.option("--sweep", metavar="NAME", default=None,
              help="Every job of sweep NAME (orch submit --sweep) in one figure, labelled by their values.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The PNG to write (default runs/<job id>/curves.png, beside what orch fetch writes; for several "
                   "jobs runs/compare/curves.png, for --sweep runs/<sweep name>/curves.png; never synced).")
@click.option("--runs", "runs_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
              help="Where `orch fetch` put jobs: runs/<job id>/metrics.jsonl is used when present.")
@pass_app
def plot_cmd(app: App, jobs: tuple[str, ...], sweep: str | None, output: Path | None, runs_dir: Path) -> None:
    """Draw loss (train and eval), lr and tokens/s against step into a PNG.

    Uses the fetched runs/<job>/metrics.jsonl, or the job's file on its host. A panel with
    no points is left out; each attempt (orch resume) is its own segment of the curve.
    Several jobs, or a sweep, go into one figure: train and eval loss of each, one colour per
    job, the legend naming each by its sweep values (or its job id).
    Needs matplotlib (pip install matplotlib; from a clone: pip install '.[plot]').

    \b
    Examples:
      orch plot gpt2-lora
      orch plot gpt2-lora-20261129-101500-1a2b -o curves.png
      orch plot gpt2-lora-20261129-101500-1a2b gpt2-lora-20261129-114000-9f3e
      orch plot --sweep gpt2-lora-sweep-20261129-101500
    """
    if sweep is not None and jobs:
        raise UsageError("give JOBs or --sweep NAME, not both")
    if sweep is None and not jobs:
        raise UsageError("give a JOB (several to compare them) or --sweep NAME")
    if sweep is None and len(jobs) == 1:
        record = app.registry.get(jobs[0])
        rows, source = read_metrics(record, app.inventory, runs_dir)
        out = output or runs.run_dir(runs_dir, record.job_id) / "curves.png"
        save_plot(rows, record.job_id, out)
        counts = ", ".join(f"{len(series(rows, k)[0])} {k}" for k in ("loss", "eval_loss", "lr", "tokens_per_s"))
        attempts = len({r["attempt"] for r in rows if "attempt" in r})
        app.say(f"read {source}: {counts} points" + (f" of {attempts} attempts" if attempts > 1 else ""))
        click.echo(str(out))
        return
    if sweep is not None:
        records = [r for r, _ in members(app.registry, sweep)]
    else:
        records = list({r.job_id: r for r in map(app.registry.get, jobs)}.values())
    ids = [r.job_id for r in records]
    labels, legend_title = legend_labels(ids, app.registry.sweep_entries(ids))
    curves = []
    for record, label in zip(records, labels):
        try:
            rows, source = read_metrics(record, app.inventory, runs_dir)
        except UsageError as exc:  # no metrics yet: the others are still worth a look
            app.say(f"left out {record.job_id}: {exc}")
            continue
        app.say(f"{label}: read {source}: {len(series(rows, 'loss')[0])} loss, "
                f"{len(series(rows, 'eval_loss')[0])} eval_loss points")
        curves.append((label, rows))
    if not any(series(rows, "loss")[0] or series(rows, "eval_loss")[0] for _, rows in curves):
        raise UsageError("none of these jobs has a train or eval loss to plot yet")
    out = output or runs.run_dir(runs_dir, sweep or "compare") / "curves.png"
    save_figure(overlay(curves, sweep or f"{len(curves)} jobs", legend_title), out)
    click.echo(str(out))


COMMANDS = [plot_cmd]

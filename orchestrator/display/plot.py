"""Training curves from ``metrics.jsonl``: loss (train and eval), lr and tokens/s by step.

The file is the built-in trainer's, a user script's own (docs/own-script.md) or the rows the
supervisor read from what the script printed; ``learning_rate`` is read as ``lr``.
``read_metrics`` takes the fetched copy (``runs/<job>/metrics.jsonl``) when there is one,
else reads the job's file with one ``cat`` (an argv list, like every remote command) on the
first of the job's hosts that has one (rank 0, which writes it, may run on any node). Lines
from the server are untrusted: anything that is not a JSON object with a numeric ``step`` is
skipped. A panel with no points is left out. Each attempt of a job (``attempt`` in the rows)
is its own segment, and so is a run of rows after the step went down (a restart from an
earlier checkpoint): a curve never goes back in time. matplotlib is an optional extra (``pip
install matplotlib``, or the ``plot`` extra of the ``orch-gpu`` distribution) and is imported
only when drawing.

``overlay`` draws several jobs in one figure (``orch plot JOB1 JOB2 ...``, ``orch plot --sweep
NAME``), labelled by ``legend_labels``: a sweep's varied values, else job ids.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from orchestrator.access.connect import open_transport
from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import Inventory
from orchestrator.spec.sweepkeys import label, short_keys
from orchestrator.state.registry import JobRecord, SweepEntry, short_ids
from orchestrator.transport.base import never

MAX_BYTES = 256 << 20
SERIES = {"loss": "train loss", "eval_loss": "eval loss", "lr": "lr", "tokens_per_s": "tokens/s"}
ALIASES = {"learning_rate": "lr"}
HEIGHTS = {1: 5, 2: 7, 3: 9}  # figure height (inches) for that many panels


def parse_metrics(text: str) -> list[dict[str, float]]:
    """Rows with a finite numeric ``step``; only the numeric fields of ``SERIES`` (and
    ``attempt``) kept."""
    rows = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if not isinstance(value, dict) or not _finite(value.get("step")):
            continue
        row = {"step": float(value["step"])}
        row.update({ALIASES[k]: float(v) for k, v in value.items() if k in ALIASES and _finite(v)})
        row.update({k: float(value[k]) for k in SERIES if _finite(value.get(k))})
        if _finite(value.get("attempt")):
            row["attempt"] = float(value["attempt"])
        rows.append(row)
    return rows


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_metrics(record: JobRecord, inventory: Inventory, runs: Path) -> tuple[list[dict[str, float]], str]:
    """(rows, where they came from). Local fetched copy first, else the host's file."""
    local = runs / record.job_id / "metrics.jsonl"
    if local.is_file():
        return parse_metrics(local.read_text(encoding="utf-8", errors="replace")), str(local)
    path = record.job_dir.rstrip("/") + "/metrics.jsonl"
    for name in record.hosts:
        host = inventory.get(name)
        with open_transport(host, inventory, never) as transport:
            result = transport.run(["cat", "--", path], timeout=120)
        if result.ok:
            return parse_metrics(result.stdout[:MAX_BYTES].decode("utf-8", "replace")), f"{host.name}:{path}"
    raise UsageError(f"{record.job_id} has no metrics.jsonl yet ({path} on {', '.join(record.hosts)}): the built-in "
                     "trainer writes it every log_every steps; your own script: report(), progress lines it prints "
                     "(launch.progress for a format of its own) or a Hugging Face Trainer log (docs/own-script.md)")


def series(rows: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    points = [(r["step"], r[key]) for r in rows if key in r]
    return [p[0] for p in points], [p[1] for p in points]


def segments(rows: list[dict[str, float]], key: str) -> list[tuple[list[float], list[float]]]:
    """``series`` cut into the pieces drawn as separate lines, in file order: a new one where
    ``attempt`` changes (a row without one differs from one with) or the step goes down."""
    out: list[tuple[list[float], list[float]]] = []
    last: tuple[float, float | None] | None = None
    for row in rows:
        if key not in row:
            continue
        attempt = row.get("attempt")
        if last is None or attempt != last[1] or row["step"] < last[0]:
            out.append(([], []))
        out[-1][0].append(row["step"])
        out[-1][1].append(row[key])
        last = (row["step"], attempt)
    return out


def _plot_segments(ax: Any, rows: list[dict[str, float]], key: str, style: str, color: str,
                   label: str | None = None, **kwargs: Any) -> bool:
    """Each segment of ``key`` on ``ax`` in one colour, labelled once; False when there is none."""
    parts = segments(rows, key)
    for i, (xs, ys) in enumerate(parts):
        ax.plot(xs, ys, style, color=color, label=label if i == 0 else None, **kwargs)
    return bool(parts)


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend; ``UsageError`` saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("orch plot needs matplotlib: pip install matplotlib (from a clone: pip install '.[plot]')") from None
    return plt


def draw(rows: list[dict[str, float]], title: str) -> Any:
    """A matplotlib Figure: loss (train, eval), lr, tokens/s against step, one axis each; an
    axis with no points is left out (the loss axis stays when nothing has any)."""
    plt = _pyplot()
    panels = [p for p, keys in (("loss", ("loss", "eval_loss")), ("lr", ("lr",)), ("tokens_per_s", ("tokens_per_s",)))
              if any(k in r for r in rows for k in keys)] or ["loss"]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, HEIGHTS[len(panels)]), sharex=True, squeeze=False)
    for panel, (ax,) in zip(panels, axes):
        if panel == "loss":
            drawn = [_plot_segments(ax, rows, key, style, color, SERIES[key])
                     for key, style, color in (("loss", "-", "C0"), ("eval_loss", "o-", "C1"))]
            ax.set_ylabel("loss")
            if any(drawn):
                ax.legend(loc="upper right")
        else:
            _plot_segments(ax, rows, panel, "-", "C0")
            ax.set_ylabel(SERIES[panel])
        ax.grid(True, alpha=0.3)
    axes[-1][0].set_xlabel("step")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def legend_labels(job_ids: list[str], entries: dict[str, SweepEntry]) -> tuple[list[str], str | None]:
    """(a label per job, the legend's title): the varied values (``lr=1e-4, r=8``, each key by
    its shortest distinct tail) when every job is of one sweep, titled ``sweep NAME``; else each
    job id's shortest unique prefix among ``job_ids``, untitled."""
    sweeps = {entries[j].sweep for j in job_ids if j in entries}
    if len(sweeps) == 1 and all(j in entries for j in job_ids):
        keys = list(dict.fromkeys(k for j in job_ids for k, _ in entries[j].pairs()))
        short = short_keys(keys)
        return [label(entries[j].pairs(), short) for j in job_ids], f"sweep {sweeps.pop()}"
    ids = short_ids(job_ids)
    return [ids[j] for j in job_ids], None


def overlay(curves: list[tuple[str, list[dict[str, float]]]], title: str, legend_title: str | None = None) -> Any:
    """Several jobs in one Figure: train loss (solid) on the first axis and, when any job has
    one, eval loss (dashed, dots) on a second, one colour per job (each attempt its own
    segment); the first axis's legend holds every job's label, in order (``(label, rows)`` of
    ``curves``)."""
    from matplotlib.lines import Line2D

    plt = _pyplot()
    has_eval = any(series(rows, "eval_loss")[0] for _, rows in curves)
    fig, axes = plt.subplots(2 if has_eval else 1, 1, figsize=(9, 8 if has_eval else 5), sharex=True, squeeze=False)
    ax_train = axes[0][0]
    handles = []
    for i, (name, rows) in enumerate(curves):
        color = f"C{i % 10}"
        _plot_segments(ax_train, rows, "loss", "-", color)
        if has_eval:
            _plot_segments(axes[1][0], rows, "eval_loss", "o--", color, markersize=3)
        handles.append(Line2D([], [], color=color, label=name))
    ax_train.set_ylabel(SERIES["loss"])
    ax_train.legend(handles=handles, title=legend_title, loc="upper right", fontsize="small")
    if has_eval:
        axes[1][0].set_ylabel(SERIES["eval_loss"])
    axes[-1][0].set_xlabel("step")
    for row in axes:
        row[0].grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def save_figure(fig: Any, out: Path) -> None:
    """Write ``fig`` as a PNG at ``out`` (its folder made) and free it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    _pyplot().close(fig)


def save_plot(rows: list[dict[str, float]], title: str, out: Path) -> None:
    if not any(k in r for r in rows for k in SERIES):
        raise UsageError("metrics.jsonl holds no loss, eval loss, lr or tokens/s value with a step to plot yet")
    save_figure(draw(rows, title), out)

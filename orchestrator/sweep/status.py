"""``orch status --sweep NAME``: one row per combination of a sweep (docs/sweeps.md).

Columns: ``#`` (the combination), one column per swept key (headed by its shortest distinct
tail: ``lr``, ``r``), STATE, BEST EVAL, LOSS, STEP, HOST, JOB; fitted to the terminal like
``orch status`` (``table.fit``: the key columns and STATE always, the rest by that order).
Below the table, one line: how many combinations are in each state and the best eval loss.

LOSS is the job's final (or, while it runs, latest) train loss, from the same status row
``orch status`` shows (a finished job's recorded final row). BEST EVAL is the lowest
``eval_loss`` in the job's metrics (the fetched ``runs/<job>/metrics.jsonl``, else the host's
file); for a finished job it is read once and kept in the registry with its sweep entry
(``Registry.record_sweep_summary``, tied to the job's end), so a sweep whose jobs all ended
is shown without any network. When the metrics cannot be read it is the latest eval loss of
the status row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from orchestrator.display.table import Column, fit
from orchestrator.errors import HostError, OrchError, UsageError
from orchestrator.spec.sweepkeys import short_keys
from orchestrator.state.registry import SUBMITTING, TERMINAL, JobRecord, Registry, SweepEntry, short_ids
from orchestrator.termtext import clean

if TYPE_CHECKING:
    from orchestrator.display.progress import JobProgress
    from orchestrator.hosts.inventory import Inventory

Members = list[tuple[JobRecord, SweepEntry]]


class App(Protocol):
    """What the rows need of the command's application object (``cli.app.App``)."""

    @property
    def inventory(self) -> Inventory: ...

    @property
    def registry(self) -> Registry: ...


@dataclass(frozen=True)
class SweepRow:
    """One combination's line (strings already cleaned of control characters)."""

    combination: int
    values: list[str]
    state: str
    host: str
    step: str
    loss: float | None
    best_eval: float | None
    job_id: str


def members(registry: Registry, name: str) -> Members:
    """The sweep's jobs, one per combination; ``UsageError`` naming the known sweeps when
    there is none of that name. A combination with several (a reservation of a submit whose
    launch was cut off, then the job a later submit started for it elsewhere) is its newest
    started job, else its newest reservation: never counted twice."""
    found = registry.sweep_jobs(name)
    if not found:
        known = registry.sweep_names()
        listed = ", ".join(known[:8]) + (f", and {len(known) - 8} more" if len(known) > 8 else "")
        raise UsageError(f"no sweep {name!r}" + (f" (sweeps: {listed})" if known else " (none yet: orch submit "
                                                                                         "JOB.yaml --sweep KEY=V1,V2)"))
    chosen: dict[int, tuple[JobRecord, SweepEntry]] = {}
    for record, entry in found:
        kept = chosen.get(entry.combination)
        rank = (record.state != SUBMITTING, record.created)
        if kept is None or rank > (kept[0].state != SUBMITTING, kept[0].created):
            chosen[entry.combination] = (record, entry)
    return [chosen[n] for n in sorted(chosen)]


def keys_of(found: Members) -> list[str]:
    """The swept keys in the sweep's order (the first job's)."""
    return list(dict.fromkeys(k for _, entry in found for k, _ in entry.pairs()))


def _loss(value: float | None) -> str:
    return f"{value:.4f}" if value is not None else ""


def sweep_lines(keys: list[str], rows: list[SweepRow], width: int | None, known_ids: list[str],
                total: int | None = None) -> list[str]:
    """The table (header first) and the summary line, each at most ``width`` cells (None:
    everything, full job ids); ``total``: the sweep's combinations, when some have no job.
    Pure."""
    short = short_keys(keys)
    columns = [Column("#", 0, right=True, required=True),
               *(Column(short[k], 0, right=True, required=True, min_width=6) for k in keys),
               Column("STATE", 0, required=True), Column("BEST EVAL", 1, right=True), Column("LOSS", 2, right=True),
               Column("STEP", 3, right=True), Column("HOST", 4), Column("JOB", 5, min_width=8)]
    ids = {r.job_id: r.job_id for r in rows} if width is None else short_ids([*known_ids, *(r.job_id for r in rows)])
    cells = [[str(r.combination), *r.values, r.state, _loss(r.best_eval), _loss(r.loss), r.step, r.host, ids[r.job_id]]
             for r in rows]
    lines = fit(columns, cells, width)
    summary = summary_line(rows, total)
    return lines + [summary[:width] if width else summary]


def summary_line(rows: list[SweepRow], total: int | None = None) -> str:
    """``4 combinations: 3 succeeded, 1 running; best eval 1.2345 (#2)``; the combinations
    of ``total`` without a job are ``not started``."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.state.split(" ")[0]] = counts.get(row.state.split(" ")[0], 0) + 1
    total = max(total or 0, len(rows))
    if total > len(rows):
        counts["not started"] = total - len(rows)
    text = f"{total} combination{'s' if total != 1 else ''}: "
    text += ", ".join(f"{n} {s}" for s, n in counts.items())
    scored = [r for r in rows if r.best_eval is not None]
    if scored:
        best = min(scored, key=lambda r: r.best_eval)  # type: ignore[arg-type, return-value]
        text += f"; best eval {best.best_eval:.4f} (#{best.combination})"
    return text


def best_eval(app: App, record: JobRecord, status: dict[str, Any], entry: SweepEntry,
              latest: float | None, runs: Path) -> float | None:
    """The lowest eval loss of the job (see the module docstring); ``latest`` (the status
    row's) when its metrics cannot be read."""
    terminal = status.get("state") in TERMINAL and not status.get("stale")
    stamp = [status.get("state"), status.get("ended")]
    if terminal and entry.summary.get("for") == stamp and "best_eval_loss" in entry.summary:
        kept = entry.summary["best_eval_loss"]
        return float(kept) if isinstance(kept, (int, float)) and math.isfinite(kept) else None
    from orchestrator.display.plot import read_metrics

    try:
        rows, _ = read_metrics(record, app.inventory, runs)
    except HostError:
        return latest  # the host may come back: not kept
    except (OrchError, OSError, EOFError):
        rows = None
    evals = [r["eval_loss"] for r in rows or [] if "eval_loss" in r]
    best = min(evals) if evals else (latest if rows is None else None)
    if terminal:
        app.registry.record_sweep_summary(record.job_id, {"for": stamp, "best_eval_loss": best})
    return best


def rows_for(app: App, found: Members, statuses: dict[str, dict[str, Any]],
             progress_of: Callable[[App, JobRecord, dict[str, Any]], JobProgress], runs: Path) -> list[SweepRow]:
    """One ``SweepRow`` per job of the sweep, with ``progress_of`` (``cli.status``'s) for the
    status columns."""
    keys = keys_of(found)
    rows = []
    for record, entry in found:
        status = statuses[record.job_id]
        progress = progress_of(app, record, status)
        values = dict(entry.pairs())
        step = progress.step_text()
        rows.append(SweepRow(entry.combination, [clean(values.get(k, "")) for k in keys], progress.state,
                             clean(",".join(record.hosts)), step, progress.loss,
                             best_eval(app, record, status, entry, progress.eval_loss, runs), record.job_id))
    return rows


def as_json(found: Members, rows: list[SweepRow], name: str) -> list[dict[str, Any]]:
    """``orch status --sweep NAME --json``: one object per combination."""
    out = []
    for (record, entry), row in zip(found, rows):
        out.append({"sweep": name, "combination": entry.combination, "combinations": entry.combinations,
                    "values": {str(v[0]): v[1] for v in entry.values if isinstance(v, list) and len(v) == 3},
                    "job_id": record.job_id, "state": row.state, "host": row.host, "step": row.step,
                    "loss": row.loss, "best_eval_loss": row.best_eval})
    return out


def combinations_of(found: Members) -> int:
    """How many combinations the sweep has (its entries say), started or not."""
    return max((entry.combinations for _, entry in found), default=0)

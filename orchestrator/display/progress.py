"""Progress of a running job, for people: the columns of ``orch status`` and the progress
line of ``orch logs -f`` / ``orch submit --follow``.

Everything here is derived from what the server already reports (the status record with
the last line of ``metrics.jsonl``, and the streamed log text): no extra round trip.
``row_fields`` and ``status_lines`` are pure; ``FollowBar`` only draws on a terminal.
rich is imported by ``FollowBar`` only: ``orch status`` of finished jobs never loads it.
"""

from __future__ import annotations

import math
import re
import sys
import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from orchestrator.display.table import Column, fit
from orchestrator.state.registry import short_ids
from orchestrator.termtext import clean

if TYPE_CHECKING:
    from rich.console import Console

# The built-in trainer's progress line (remote_payload/train.py, ``report``):
#   step 20/100 | epoch 0 | loss 2.3456 | lr 4.00e-03 | grad norm 1.234 | 5210 tok/s | 812 MiB
STEP_LINE = re.compile(r"\bstep (\d+)/(\d+) \| epoch \d+ \| loss ([-+0-9.eEnaif]+)(?:.*?\| ([0-9.]+) tok/s)?")


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def run_span(status: dict[str, Any], created: float, now: float) -> tuple[float, float]:
    """When a job began and when it ended, from its status (the server's, read as untrusted):
    from its first attempt's start (``first_started``, ignored when later than ``started``),
    else this attempt's (``started``), else ``created``; to ``ended``, else where its provider
    box was seen down (``box_stopped_at``, ``jobs/nodes.py``), else ``now`` — never before it
    began. ELAPSED and COST (``row_fields``) and ``orch spend`` (``jobs/spend.py``) count it."""
    started = _num(status.get("started")) or created
    first = _num(status.get("first_started"))
    since = first if first is not None and first <= started else started
    ended = _num(status.get("ended")) or _num(status.get("box_stopped_at"))  # the box stopped: so did the job
    return since, max(ended or now, since)


def duration(seconds: float | None) -> str:
    """``42s``, ``5m03s``, ``2h07m``, ``3d04h``; empty for None."""
    if seconds is None:
        return ""
    s = int(max(seconds, 0))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


@dataclass(frozen=True)
class JobProgress:
    """What ``orch status`` shows for one job (None where unknown)."""

    state: str
    nodes: int
    step: int | None
    total: int | None
    loss: float | None
    eval_loss: float | None
    tokens_per_s: float | None
    elapsed_s: float  # since the first attempt started (``first_started``), else since this one did
    eta_s: float | None
    cost: float | None
    started_over_at: int | None = None  # a resumed job whose newest step is below the step it resumed from:
    resumed_from_step: int | None = None  # the script started over (its newest step; the highest step before)
    resume_dropped: str | None = None  # a later attempt whose resume_args were left out (no checkpoint): why

    @classmethod
    def from_dict(cls, data: Any) -> "JobProgress | None":
        """The inverse of ``dataclasses.asdict`` for a recorded row (``Registry.record_final``);
        None when ``data`` is not exactly such a row (another version's, or damaged)."""
        names = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or set(data) != names or not isinstance(data["state"], str):
            return None
        ints = ("nodes", "step", "total", "started_over_at", "resumed_from_step")  # nodes, elapsed_s never None
        if not all(type(data[n]) is int or (data[n] is None and n != "nodes") for n in ints):
            return None
        if not isinstance(data["resume_dropped"], (str, type(None))):
            return None
        floats = names - {"state", "resume_dropped", *ints}
        if not all(_num(data[n]) is not None or (data[n] is None and n != "elapsed_s") for n in floats):
            return None
        return cls(**data)

    @property
    def succeeded(self) -> bool:
        return self.state.split(" ", 1)[0] == "succeeded"

    def step_text(self) -> str:
        """``step/total`` (or the step alone). A succeeded job's step is shown as its total when
        one is known (the last step a script logs can lag its end); ``step`` itself stays what
        was logged."""
        if self.succeeded and self.total and self.step is not None and self.step <= self.total:
            return f"{self.total}/{self.total}"
        return "" if self.step is None else f"{self.step}/{self.total}" if self.total else str(self.step)

    def cells(self) -> list[str]:
        """The row's cells in ``STATUS_COLUMNS``' order between JOB and HOST."""
        step = self.step_text()
        loss = f"{self.loss:.4f}" if self.loss is not None else (f"eval {self.eval_loss:.4f}" if self.eval_loss is not None else "")
        tps = f"{self.tokens_per_s:,.0f}" if self.tokens_per_s is not None else ""
        cost = f"{self.cost:.2f}" if self.cost is not None else ""
        return [self.state, str(self.nodes), step, loss, tps, duration(self.eta_s), duration(self.elapsed_s), cost]


# ``orch status``'s columns in display order (JobProgress.cells between JOB and HOST). Kept by
# priority when the terminal is narrow: JOB, STATE, STEP, LOSS, then REASON (only when some
# job has one; at least 12 cells, cut with "…"), ETA, ELAPSED, TOK/S, NODES, HOST, COST; a
# column no job has anything in comes after all of them. So as the terminal narrows the reason
# is cut first, to 12 cells, before any column is left out; it never costs STEP or LOSS their
# place, and when not even its 12 cells fit it is left out alone (``orch status JOB`` prints the whole reason). STATE is never shortened; a JOB
# id is cut (with "…") only when JOB and STATE alone do not fit.
STATUS_COLUMNS = [
    Column("JOB", 0, required=True, min_width=8),
    Column("STATE", 1, required=True),
    Column("NODES", 9, right=True),
    Column("STEP", 2, right=True),
    Column("LOSS", 3, right=True),
    Column("TOK/S", 8, right=True),
    Column("ETA", 6, right=True),
    Column("ELAPSED", 7, right=True),
    Column("COST", 11, right=True),
    Column("HOST", 10),
    Column("REASON", 5, min_width=12, skippable=True),  # last: status_lines(reasons=False) drops it
]
WIDE_REASON = 200  # cells of a reason shown by --wide (a server's reason is not a log)
_RANK_PREFIX = re.compile(r"^rank \d+ on node \d+: ")  # supervisor/failure.py's reason, as the table shows it
_FULL_LOG = re.compile(r";? *full log: orch logs \S+$")
_NOT_ANSWERING = re.compile(r"^supervisor not answering for (?=\d+ s: )")  # remote_payload/jobdir/answering.py


def table_reason(reason: str, nodes: int) -> str:
    """A reason as the REASON column shows it: the failure line's pointer to the log dropped
    (``orch logs JOB`` is known), on a one-node job its ``rank R on node N:`` head (the
    exception comes first), and a silent supervisor's ``supervisor not answering for`` head
    (STATE says ``(not answering)``; ``43 s: stopped ...`` is left). The whole reason is in
    ``orch status JOB`` and ``--json``."""
    short = _NOT_ANSWERING.sub("", _FULL_LOG.sub("", reason))
    return (_RANK_PREFIX.sub("", short) if nodes == 1 else short) or reason


@dataclass(frozen=True)
class StatusRow:
    """One job's line of ``orch status``; ``reason`` already passed through ``clean``."""

    job_id: str
    progress: JobProgress
    hosts: list[str]
    reason: str


def status_lines(rows: Sequence[StatusRow], width: int | None, known_ids: Iterable[str] | None = None,
                 reasons: bool = True) -> list[str]:
    """``orch status`` as lines of plain text (header first), each at most ``width`` cells.

    ``width=None`` is ``--wide``: full job ids and every column. Otherwise job ids are
    shortened to their shortest unique prefix among ``known_ids`` (default: the rows'
    ids; pass every registry id so the prefix works with ``Registry.get``) and columns are
    kept by ``STATUS_COLUMNS``' priorities (``table.fit``), the reasons shortened
    (``table_reason``). ``reasons=False`` leaves the REASON column out (``orch status JOB``
    prints the reason whole under the row: ``detail_lines``)."""
    ids = {r.job_id: r.job_id for r in rows} if width is None \
        else short_ids([*(known_ids or ()), *(r.job_id for r in rows)])
    cells = [[ids[r.job_id], *r.progress.cells(), ",".join(r.hosts),
              (r.reason if width is None else table_reason(r.reason, r.progress.nodes))[:WIDE_REASON]]
             for r in rows]
    if reasons:
        return fit(STATUS_COLUMNS, cells, width)
    return fit(STATUS_COLUMNS[:-1], [row[:-1] for row in cells], width)


def detail_lines(row: StatusRow, width: int | None) -> list[str]:
    """What ``orch status JOB`` prints under its row: the whole reason (wrapped to ``width``;
    one line when None) and a started-over note."""
    import textwrap

    out = []
    if row.reason:
        text = "reason: " + " ".join(row.reason.split())
        out += [text] if width is None else textwrap.wrap(text, max(width, 20), subsequent_indent="  ",
                                                          break_on_hyphens=False)
    note = started_over_note(row.progress)
    if note:
        out.append(f"note: {note}")
    return out


def row_fields(status: dict[str, Any], created: float, nodes: int, total: int | None,
               price_per_hour: float | None, now: float | None = None) -> JobProgress:
    """Derive the status columns. ``total`` comes from the metrics (``total_steps``) when the
    trainer writes it, else from the caller (the spec's ``train.max_steps``). ETA assumes the
    pace so far (step / time since the supervisor started) holds; only while running.

    Elapsed time counts from the first attempt's start (``first_started``, which the
    supervisor writes for attempt > 1; ignored when later than ``started``), else from
    this attempt's. A later attempt whose newest step is below ``resumed_from_step`` (the
    highest step logged before it began) started over: the row's state says so and
    ``started_over_at`` / ``resumed_from_step`` carry the two steps. So did one whose
    ``resume_args`` the supervisor left out for want of a checkpoint (``resume_dropped``, its
    reason, whether or not any step was logged). Every field is the
    server's, read as untrusted (a wrong type counts as absent). A job whose provider box was
    seen down (``box_stopped_at``, ``jobs/nodes.py``) ends there: ELAPSED and COST stop growing."""
    now = time.time() if now is None else now
    metrics = status.get("metrics") if isinstance(status.get("metrics"), dict) else {}
    started = _num(status.get("started")) or created
    since, end = run_span(status, created, now)
    elapsed = end - since
    step_value = _num(metrics.get("step"))
    step = int(step_value) if step_value is not None else None
    total_value = _num(metrics.get("total_steps"))
    total = int(total_value) if total_value else total
    eta = None
    over_at, resumed_from = _started_over(status, step)
    dropped = _resume_dropped(status)
    state = clean(str(status.get("state"))) + (" (stale)" if status.get("stale") else "") \
        + (" (unsupervised)" if status.get("unsupervised") else "") \
        + (" (not answering)" if _num(status.get("not_answering_s")) is not None else "") \
        + (" (started over)" if over_at is not None or dropped is not None else "")
    when = _num(metrics.get("time")) or now
    if status.get("state") == "running" and step and total and when > started:
        eta = (total - step) * (when - started) / step - (now - when)
        eta = max(eta, 0.0)
    cost = price_per_hour * nodes * elapsed / 3600 if price_per_hour is not None else None
    return JobProgress(state, nodes, step, total, _num(metrics.get("loss")), _num(metrics.get("eval_loss")),
                       _num(metrics.get("tokens_per_s")), elapsed, eta, cost, over_at, resumed_from, dropped)


def _started_over(status: dict[str, Any], step: int | None) -> tuple[int | None, int | None]:
    """(newest step, step resumed from) when a later attempt's newest step is below the step
    it resumed from; else (None, None)."""
    attempt, resumed = status.get("attempt"), _num(status.get("resumed_from_step"))
    if type(attempt) is not int or attempt < 2 or resumed is None or step is None or step >= resumed:
        return None, None
    return step, int(resumed)


def _resume_dropped(status: dict[str, Any]) -> str | None:
    """Why a later attempt's ``resume_args`` were left out (status.json's ``resume_dropped``,
    one clean line), or None."""
    attempt, why = status.get("attempt"), status.get("resume_dropped")
    if type(attempt) is not int or attempt < 2 or not isinstance(why, str) or not why.strip():
        return None
    return " ".join(clean(why).split())[:300]


def started_over_note(progress: JobProgress) -> str | None:
    """``started over at step 380 (was 980 before the resume)``, ``started over: no complete
    checkpoint for {last_checkpoint} ...: resume_args left out`` (both when both hold), or None."""
    parts = []
    if progress.started_over_at is not None:
        parts.append(f"started over at step {progress.started_over_at} (was {progress.resumed_from_step} before the "
                     "resume)")
    if progress.resume_dropped is not None:
        parts.append(("" if parts else "started over: ") + progress.resume_dropped)
    return "; ".join(parts) or None


class FollowBar:
    """A progress line (step/total, loss, tokens/s) on a terminal's stderr, fed by the log
    text that ``wrap``'s writer passes through. Use as a context manager."""

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._partial = ""
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}  {task.fields[tps]} tok/s"), TimeRemainingColumn(),
            console=console, redirect_stdout=sys.stdout.isatty(), redirect_stderr=False, transient=False,
        )
        self.task = self.progress.add_task("step", total=None, loss="-", tps="-")

    @staticmethod
    def enabled(as_json: bool) -> bool:
        return not as_json and sys.stderr.isatty()

    def feed(self, text: str) -> None:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()[-4096:]
        for line in lines:
            match = STEP_LINE.search(line)
            if match:
                step, total, loss, tps = match.groups()
                self.progress.update(self.task, completed=int(step), total=int(total), loss=loss,
                                     tps=tps or "-")

    def wrap(self, write: Callable[[str], None]) -> Callable[[str], None]:
        def both(text: str) -> None:
            write(text)
            self.feed(text)
        return both

    def __enter__(self) -> "FollowBar":
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

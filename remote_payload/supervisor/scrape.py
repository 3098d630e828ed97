"""Metrics rows for a user script from what it already prints (standard library only).

A user script that never writes ``metrics.jsonl`` itself still gets STEP/LOSS/ETA in
``orch status`` and curves in ``orch plot``. While the job runs, a thread in the supervisor
(``metricswatch.watch``) follows this node's log and appends recognised rows to
``<job_dir>/metrics.jsonl`` in the protocol of docs/own-script.md, each marked with its
``"source"`` (one of ``SOURCES``):

- ``hf-log``: Hugging Face ``Trainer``'s ``{'loss': '2.31', 'grad_norm': ..., 'learning_rate':
  ..., 'epoch': ...}`` (floats, or strings in transformers 5) and ``{'eval_loss': ...}``. They
  carry no step: the step and the total come from the training progress bar (``| 12/20 [``)
  that tqdm redraws right after each such line. A dict line with its own numeric ``step``
  needs no bar; any printed ``{...}`` with ``loss`` or ``eval_loss`` is taken.
- ``hf-state``: ``trainer_state.json`` in the newest ``checkpoint-N/`` within a few levels of
  the job folder (the snapshot ``code/`` included, where a relative ``output_dir`` lands):
  its ``max_steps`` is the total, and ``log_history`` entries newer than every row written
  so far are added (a run printing no bar still gets stepped rows at each checkpoint).
- ``log``: progress lines scripts print themselves. A line of ``key value`` pairs with a step
  (``step``, ``iter``, ``iteration``, ``global_step``, ``num_updates``; ``20/100`` gives the
  total) or an ``epoch``, and a training or eval loss: nanoGPT's ``iter 40: loss 3.2100, time
  12.34ms, mfu 1.23%`` and ``step 250: train loss 3.1234, val loss 3.2345``, ``epoch 1 step
  200 loss 0.5``, ``Step 20/100 | loss 2.31``, ``Epoch [1/5], Step [100/600], Loss: 0.2188``;
  a tqdm bar whose description or postfix holds a loss (``12/200 [00:03<00:40, 4.5it/s,
  loss=2.31]``: step 12 of 200; Lightning's ``Epoch 2: ... 16/32 [..., v_num=0,
  train_loss=0.512]``: batches done over the epochs, 2 * 32 + 16); Lightning's Rich bar
  (``Epoch 2/9 ━━╸ 16/32 0:00:01 • 0:00:02 12.34it/s train_loss: 0.512``, its metrics maybe
  wrapped onto the next lines, one a line when the bar is wide; the supervisor's ``TTY_COMPATIBLE``/``TTY_INTERACTIVE`` make Rich
  redraw into the log); torchtune's bar (``1|20|Loss: 11.90: 5%|...``: epoch|global step);
  a dict after a short prefix (``epoch 1: {'loss': ...}``); HF's ``***** eval metrics *****``
  table (``trainer.log_metrics``), at the last step seen, and so is an eval line without a
  step (accelerate's ``epoch 0: perplexity: ... eval_loss: ...`` after a tqdm bar without a
  loss; a line printed right after a bar's last redraw is read as its own line). Never a step
  the output does not show.
- ``progress``: lines matching the job's ``launch.progress`` regex (named groups among
  ``PROGRESS_GROUPS``), before the built-in formats. The pattern is the user's: it is only
  ever searched in a worker process, each line under a CPU budget
  (``contract/userpattern.py``), never in the supervisor, so a catastrophic one cannot stall it.

Contracts: the built-in trainer (a job with ``train.json``) is never watched: it writes its
own rows. A job that writes ``metrics.jsonl`` itself (``remote_payload.report`` or by hand)
wins: before every append the file must be exactly as this watcher left it, otherwise the
watcher stops adding rows for the rest of the attempt. Everything read is bounded (segment
length, bytes per poll, directories per scan, trainer_state.json size), and so is what is
written: printed lines give at most ``LINE_RATE`` rows a second (bursts of ``LINE_BURST``), a
redrawn bar one row per ``BAR_ROW_S``; the newest row held back is written later, eval rows
always. A printed line with the step, epoch and kind of one read in the last ``SAME_S`` (a
script that prints on every rank) is no second row. The thread never raises into the supervisor and never blocks the job. Set
``ORCH_METRICS_FROM_LOG=0`` in the job's env to turn it off.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

from remote_payload.contract.jobfolder import PROGRESS_GROUPS
from remote_payload.jobdir import scan

POLL_S = 1.0
STATE_SCAN_S = 15.0
PENDING_MAX_S = 5.0  # a dict line no bar follows is written with the last known step after this
MAX_SEGMENT = 16 * 1024  # a longer line is never a metrics line
MAX_TEXT = 1024  # a longer line is no printed progress line (dicts and launch.progress: MAX_SEGMENT)
MAX_PREFIX = 200  # text before a printed dict: ``epoch 1: {...}``
MAX_READ = 1 << 20  # log bytes per read
MAX_STATE_BYTES = 32 << 20
SCAN_DEPTH = 4  # levels of the job folder looked through for trainer_state.json (scan.py bounds the rest)
MAX_KEYS = 32
LINE_RATE, LINE_BURST = 20.0, 200.0  # rows from printed lines: per second, and at once
BAR_ROW_S = 2.0  # a progress bar redraws all the time: one row from it per this many seconds
SAME_S, MAX_RECENT = 2.0, 4096  # a printed line like one read this recently (every rank printing it): no row
ALIASES = {"learning_rate": "lr", "val_loss": "eval_loss"}
SOURCES = ("hf-log", "hf-state", "log", "progress")  # every row written here says which
ORCH_SAYS = "[orch] "  # how the supervisor's own lines in the node log start

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_BAR = re.compile(r"^\s*\d{1,3}%\|[^|]*\|\s*(\d+)/(\d+)\s*\[")  # tqdm without a description
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$")
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
# Any tqdm bar, ``desc: 6%|▌  | 12/200 [00:03<00:40, 4.5it/s, loss=2.31]`` or without a total
# ``desc: 12it [00:03, 4.5it/s, loss=2.31]``: the description, n/total and the postfix.
_TQDM = re.compile(
    r"^\s*(?:(?P<desc>[^|\[\]]{0,200}?):\s*)?"
    r"(?:\d{1,3}%\|[^|]{0,400}\|\s*(?P<n>\d+)/(?P<total>\d+)|(?P<count>\d+)[A-Za-z]{0,16})"
    r"\s*\[\d+:\d\d(?::\d\d)?(?:<[^,\]]{0,32})?,\s*[^,\]]{0,64}(?P<postfix>,[^\]]{0,2000})?\]\s*$")
_LIGHTNING_DESC = re.compile(r"^\s*Epoch (\d+)(?:/-?\d+)?\s*$")  # Lightning's training bar: 0-based epochs
# (Rich's shows max_epochs - 1 after the slash: -2 when max_steps alone bounds the run)
# Lightning's RichProgressBar, one redraw: ``Epoch 1/4  ━━━━╸     16/32 0:00:01 • 0:00:02 12.34it/s
# train_loss: 0.512``: description, bar, n/total (``1,000/--`` without a total), times, rate, metrics.
_RICH = re.compile(
    r"^\s*(?P<desc>[^━╸╺]{0,200}?)\s+[━╸╺\s]{0,400}?(?P<n>\d[\d,]{0,18})/(?P<total>\d[\d,]{0,18}|--)"
    r"\s+(?:\d+:)?\d+:\d\d\s+•\s+(?:-:--:--|(?:\d+:)?\d+:\d\d)\s+[\d.]+\s*(?:it|s)/(?:s|it)\b(?P<postfix>.{0,2000})$")
_RICH_MORE = re.compile(r"^\s{8,}(?:[A-Za-z_][\w./-]{0,63}: \S{1,64}\s*){1,32}$")  # its metrics wrapped on
# torchtune's recipes: ``1|20|Loss: 11.90: 5%|▌  | 1/20 [...]``: epoch (1-based) | global step | loss.
_TORCHTUNE = re.compile(r"^\s*(\d{1,9})\|(\d{1,15})\|Loss: (%s)" % r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_LIGHTNING_POSTFIX = re.compile(r"(?:^|,)\s*v_num=")
_TABLE = re.compile(r"^\*{5} (\w{1,32}) metrics \*{5}\s*$")  # transformers' Trainer.log_metrics
_TABLE_LINE = re.compile(r"^ {2}([A-Za-z_][\w./-]{0,63})\s*=\s*(\S{1,64})\s*$")

# Printed ``key value`` pairs: canonical key, the phrases read as it (a space also matches _).
_WORDS = (
    ("step", ("global step", "num updates", "iteration", "step", "iter")),
    ("epoch", ("epoch",)),
    ("loss", ("train loss step", "train loss", "training loss", "train/loss", "loss/train", "loss")),
    ("eval_loss", ("validation loss", "valid loss", "val loss", "eval loss", "val/loss", "eval/loss", "loss/val",
                   "loss/eval")),
    ("lr", ("learning rate", "lr")),
    ("tokens_per_s", ("tokens per second", "tokens per sec", "tokens per s", "tokens/sec", "tokens/s", "tok/sec",
                      "tok/s", "tps")),
    ("grad_norm", ("grad norm", "gnorm")),
)
_NUM = r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_PAIR = re.compile(
    r"(?<![\w/.-])(?:%s)(?![\w/-])\s*[:=]?\s*\[?\s*(?P<value>%s)(?:\s*/\s*(?P<of>\d{1,15}))?(?![\w.]*\w)" % (
        "|".join("(?P<%s>%s)" % (key, "|".join("[ _]".join(map(re.escape, p.split())) for p in phrases))
                 for key, phrases in _WORDS), _NUM), re.IGNORECASE)
_RATE = re.compile(r"(?<![\w.])(?P<value>%s)\s*tok(?:en)?s?/s(?:ec)?(?![\w/])" % _NUM, re.IGNORECASE)  # 4008 tok/s

Row = Dict[str, Any]
Fields = Dict[str, Tuple[float, Optional[int]]]


def number(value: Any) -> Optional[float]:
    """A finite float from an int, a float or a numeric string ('4.5e-05'); None otherwise."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and len(value) <= 64:
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, (int, float)):
        value = float(value)
        return value if math.isfinite(value) else None
    return None


def count(value: Optional[float]) -> Optional[int]:
    """A step or a total: a whole number >= 0 (below 10**15), else None."""
    if value is None or value < 0 or value >= 1e15 or not float(value).is_integer():
        return None
    return int(value)


def to_row(logs: Dict[Any, Any], step: Optional[float], total: Optional[int], source: str, now: float) -> Optional[Row]:
    """A protocol row from a HF logs dict: numeric values only, ``learning_rate`` as ``lr``,
    ``val_loss`` as ``eval_loss``, ``train_loss`` as ``loss`` (except in the end-of-training
    summary, which has ``train_runtime``); None unless it holds ``loss`` or ``eval_loss``."""
    row: Row = {"time": now}
    summary = "train_runtime" in logs
    for key, value in list(logs.items())[:MAX_KEYS * 2]:
        value = number(value)
        if isinstance(key, str) and _KEY.match(key) and value is not None and len(row) <= MAX_KEYS:
            name = ALIASES.get(key, key)
            if name not in row or key == name:
                row[name] = value
    if "loss" not in row and "train_loss" in row and not summary:
        row["loss"] = row.pop("train_loss")
    if "loss" not in row and "eval_loss" not in row:
        return None
    step = number(row.get("step", step))
    if step is not None:
        row["step"] = int(step)
    if total:
        row["total_steps"] = total
    row["source"] = source
    return row


def parse_dict(segment: str) -> Optional[Dict[Any, Any]]:
    """``{...}`` printed by Python (``str(dict)``) or as JSON; None for anything else."""
    text = segment.strip()
    if not (text.startswith("{") and text.endswith("}")) or len(text) > MAX_SEGMENT:
        return None
    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(text)
        except Exception:  # noqa: BLE001 - SyntaxError, ValueError, RecursionError, MemoryError ...
            continue
        if isinstance(value, dict):
            return value
    return None


def fields(text: str) -> Fields:
    """The known ``key value`` pairs of a printed line (``loss 2.31``, ``loss: 2.31``,
    ``loss=2.31``, ``Step [20/100]``, ``4008 tok/s``): canonical key -> (value, the ``/N`` after
    it); the first of each key counts. ``loss of connection``, ``loss_scale 1``,
    ``--step 5`` and ``loss: nan`` give nothing."""
    found: Fields = {}
    for m in _PAIR.finditer(text):
        key = next(k for k, _ in _WORDS if m.group(k) is not None)
        value = number(m.group("value").replace(",", ""))
        if value is not None and key not in found:
            found[key] = (value, int(m.group("of")) if m.group("of") else None)
    if "tokens_per_s" not in found:
        m = _RATE.search(text)
        value = number(m.group("value").replace(",", "")) if m else None
        if value is not None:
            found["tokens_per_s"] = (value, None)
    return found


def _line_step(found: Fields) -> Tuple[Optional[int], Optional[int]]:
    """(step, total) a line's pairs give."""
    if "step" not in found:
        return None, None
    value, of = found["step"]
    step = count(value)
    return (step, of if step is not None and of else None)


def text_row(text: str, now: float) -> Optional[Row]:
    """A row from a printed progress line, or None: the line must name a step (or an epoch)
    and a training or eval loss, each followed by its number; it is never longer than
    MAX_TEXT."""
    if len(text) > MAX_TEXT or "loss" not in text.lower():
        return None
    found = fields(text)
    step, total = _line_step(found)
    if (step is None and "epoch" not in found) or not ("loss" in found or "eval_loss" in found):
        return None
    row: Row = {"time": now}
    if step is not None:
        row["step"] = step
    if total:
        row["total_steps"] = total
    for key in ("epoch", "loss", "eval_loss", "lr", "tokens_per_s", "grad_norm"):
        if key in found:
            row[key] = found[key][0]
    row["source"] = "log"
    return row


def prefixed_dict_row(segment: str, now: float) -> Optional[Row]:
    """``epoch 1: {'loss': 0.5, ...}`` (``print(f"epoch {epoch}: {metrics}")``): a dict after a
    short prefix that names a step or an epoch (or the dict does); the dict's keys win."""
    text = segment.strip()
    start = text.find("{")
    if start <= 0 or start > MAX_PREFIX or not text.endswith("}"):
        return None
    logs = parse_dict(text[start:])
    if logs is None:
        return None
    found = fields(text[:start])
    step, _ = _line_step(found)
    merged: Dict[Any, Any] = {}
    if step is not None:
        merged["step"] = step
    if "epoch" in found:
        merged["epoch"] = found["epoch"][0]
    merged.update(logs)
    if number(merged.get("step")) is None and number(merged.get("epoch")) is None:
        return None
    return to_row(merged, None, None, "log", now)


class Matcher(Protocol):
    """What searches ``launch.progress``: ``contract.userpattern.PatternWorker``."""

    def search_all(self, lines: Sequence[str]) -> List[Optional[Dict[str, str]]]: ...


def progress_row(groups: Optional[Dict[str, str]], now: float) -> Optional[Row]:
    """A row from the named groups of a line ``launch.progress`` matched: those in
    PROGRESS_GROUPS, as numbers (``1,000`` is 1000; a step or total that is not a whole number
    is left out). None when it did not match or gives no step, loss or eval_loss."""
    if groups is None:
        return None
    row: Row = {"time": now}
    for key, text in groups.items():
        if key not in PROGRESS_GROUPS or not isinstance(text, str):
            continue
        value = number(text.strip().replace(",", "").replace("_", ""))
        if key in ("step", "total_steps"):
            value = count(value)
        if value is not None:
            row[key] = value
    if not {"step", "loss", "eval_loss"} & set(row):
        return None
    row["source"] = "progress"
    return row


class LineParser:
    """Turns log text into rows. Pure apart from ``clock`` and ``progress``; feed it any chunking.

    ``progress``: what searches the job's ``launch.progress`` (a worker process), tried on
    every line first; the lines of one ``feed`` go to it together."""

    def __init__(self, clock: Callable[[], float] = time.time, progress: Optional[Matcher] = None) -> None:
        self.clock, self.progress = clock, progress
        self.partial, self.skipping = "", False
        self.pending: Optional[Tuple[Dict[Any, Any], float]] = None
        self.step: Optional[int] = None  # the HF training bar's
        self.total: Optional[int] = None
        self.last_step: Optional[int] = None  # of any row or bar: HF's eval table is at it
        self.table: Optional[Tuple[str, Dict[str, str], float]] = None
        self.held: Optional[Tuple[Row, float, str]] = None  # (row, when it may go, "bar"/"line")
        self.tokens, self.tokens_at = LINE_BURST, None  # type: float, Optional[float]
        self.bar_at: Optional[float] = None  # when the last bar row went out
        self.bar_step: Any = -1  # step of the last bar row made (written or held)
        self.bar_eval: Optional[float] = None  # the eval loss a bar last showed
        self.epoch_total: Optional[int] = None  # the longest epoch Lightning's bar showed: a max_steps cut shortens the last
        self.rich_base: Optional[Row] = None  # the step of the Rich bar just read: its metrics may wrap on
        self.recent: "OrderedDict[Any, float]" = OrderedDict()  # printed lines' (step, epoch, kind): read when

    def feed(self, text: str) -> List[Row]:
        rows: List[Row] = []
        pieces = re.split(r"[\r\n]", self.partial + text)
        self.partial = pieces.pop()
        segments: List[str] = []
        for piece in pieces:
            if self.skipping:  # the tail of an over-long line
                self.skipping = False
            elif len(piece) <= MAX_SEGMENT:  # a longer line is never a metrics line
                segments.append(_ANSI.sub("", piece))
        theirs = [s for s in segments if not s.startswith(ORCH_SAYS)]  # the supervisor's own lines are not
        found = iter(self.progress.search_all(theirs) if self.progress is not None and theirs else [])
        for segment in segments:
            if not segment.startswith(ORCH_SAYS):
                rows.extend(self._seen(self._segment(segment, next(found, None))))
        if len(self.partial) > MAX_SEGMENT:
            self.partial, self.skipping = "", True
        return rows

    def _seen(self, rows: List[Row]) -> List[Row]:
        for row in rows:
            if isinstance(row.get("step"), int):
                self.last_step = row["step"]
        return rows

    def _segment(self, segment: str, groups: Optional[Dict[str, str]]) -> List[Row]:
        """Rows from one line (escapes stripped, not the supervisor's own); ``groups``: what
        ``launch.progress`` matched in it."""
        rows: List[Row] = []
        if self.table is not None:
            line = _TABLE_LINE.match(segment)
            if line and len(self.table[1]) < MAX_KEYS * 2:
                self.table[1][line.group(1)] = line.group(2)
                return []
            rows = self._close_table()
        header = _TABLE.match(segment)
        if header:
            self.table = (header.group(1), {}, self.clock())
            return rows
        bar = _BAR.match(segment)
        if bar:
            n, total = int(bar.group(1)), int(bar.group(2))
            if self.pending is not None:  # the redraw right after a dict line: that line's step
                self.step, self.total = n, total
                rows += self._emit(n)
            elif self.total is None or total == self.total:  # not an eval bar
                self.step = self.last_step = n
        tqdm = _TQDM.match(segment) if bar or segment.rstrip().endswith("]") else None
        rich = _RICH.match(segment) if not tqdm and len(segment) <= MAX_TEXT and "•" in segment else None
        rich_base, self.rich_base = self.rich_base, None
        if groups is not None:
            row = progress_row(groups, self.clock())
            if row is not None:
                return rows + self._limit(row, "bar" if tqdm or rich else "line")
        tune = _TORCHTUNE.match(segment)
        if tune:
            return rows + self._tune_rows(tune)
        if tqdm:
            return rows + self._bar_rows(tqdm.group("desc") or "", int(tqdm.group("n") or tqdm.group("count")),
                                         int(tqdm.group("total")) if tqdm.group("total") else None,
                                         (tqdm.group("postfix") or "")[1:])
        if rich:
            total = rich.group("total").replace(",", "")
            return rows + self._bar_rows(rich.group("desc"), int(rich.group("n").replace(",", "")),
                                         int(total) if total.isdigit() else None, rich.group("postfix"), rich=True)
        if rich_base is not None and _RICH_MORE.match(segment):  # the Rich bar's metrics, wrapped onto this line
            self.rich_base = rich_base  # a narrow bar wraps one metric a line (v_num, train_loss, val_loss): more may come
            return rows + self._metric_rows(rich_base, fields(segment))
        if bar:
            close = segment.find("]", bar.end())  # a line printed right after the bar's last redraw
            return rows + (self._segment(segment[close + 1:], None) if 0 < close < len(segment) - 1 else [])
        if segment.lstrip().startswith("{"):
            logs = parse_dict(segment)
            if logs is None:
                return rows
            rows += self._emit(self.step) if self.pending is not None else []
            if number(logs.get("step")) is not None:
                row = to_row(logs, None, self.total, "hf-log", self.clock())
                return rows + ([row] if row else [])
            self.pending = (logs, self.clock())
            return rows
        row = prefixed_dict_row(segment, self.clock()) if "{" in segment else None
        if row is None:
            row = text_row(segment, self.clock())
        if row and "step" not in row and "loss" not in row and self.last_step is not None:
            row["step"] = self.last_step  # an eval line without a step (``epoch 2: ... eval_loss``): the bar's
        return rows + (self._limit(row, "line") if row else [])

    def _bar_rows(self, desc: str, n: int, total: Optional[int], postfix: str, rich: bool = False) -> List[Row]:
        """Rows from a tqdm (or Rich) bar whose description or postfix holds a loss. The step:
        one the text names, else for Lightning's training bar (``Epoch E`` and ``v_num=`` in
        tqdm's postfix; ``Epoch E/L`` on Rich's) the batches done over the epochs (E * total +
        n), else the bar's n (total: its total). An eval loss in the postfix is an eval row when
        it changes (Lightning shows it after each validation)."""
        if "loss" not in desc.lower() and "loss" not in postfix.lower():
            if rich and _LIGHTNING_DESC.match(desc):  # its metrics may come on the next line
                self.rich_base = self._bar_base(desc, n, total, {}, True)
            return []
        found = fields(desc + " , " + postfix)
        if "loss" not in found and "eval_loss" not in found:
            return []
        base = self._bar_base(desc, n, total, found, rich or bool(_LIGHTNING_POSTFIX.search(postfix)))
        if rich:
            self.rich_base = base
        return self._metric_rows(base, found)

    def _bar_base(self, desc: str, n: int, total: Optional[int], found: Fields, lightning: bool) -> Row:
        """The step, total and epoch a bar gives (see ``_bar_rows``)."""
        step, total_steps = _line_step(found)
        epoch = _LIGHTNING_DESC.match(desc)
        if step is None and epoch and lightning:
            e = int(epoch.group(1))
            self.epoch_total = max(self.epoch_total or 0, total or 0) or None
            full = self.epoch_total
            step = e * full + n if full else (n if e == 0 else None)
        elif step is None:
            step, total_steps = n, total
        base: Row = {}
        if step is not None:
            base["step"] = step
        if total_steps:
            base["total_steps"] = total_steps
        if "epoch" in found:
            base["epoch"] = found["epoch"][0]
        return base

    def _metric_rows(self, base: Row, found: Fields) -> List[Row]:
        """A bar's rows at ``base``: an eval row when its eval loss changed, a training row once
        per step (thinned as a bar)."""
        base = dict(base, time=self.clock())
        rows: List[Row] = []
        if "eval_loss" in found and found["eval_loss"][0] != self.bar_eval:
            self.bar_eval = found["eval_loss"][0]
            rows.append(dict(base, eval_loss=self.bar_eval, source="log"))
        if "loss" in found and base.get("step") != self.bar_step:
            self.bar_step = base.get("step")
            row = dict(base, source="log")
            row.update((k, found[k][0]) for k in ("loss", "lr", "tokens_per_s", "grad_norm") if k in found)
            rows += self._limit(row, "bar")
        return rows

    def _tune_rows(self, m: "re.Match[str]") -> List[Row]:
        """torchtune's bar: its description ``epoch|global step|Loss: x`` (epochs from 1)."""
        loss = number(m.group(3))
        if loss is None:
            return []
        found: Fields = {"loss": (loss, None)}
        return self._metric_rows({"step": int(m.group(2)), "epoch": float(m.group(1))}, found)

    def _limit(self, row: Row, kind: str) -> List[Row]:
        """``row`` now, or held back as the newest (written by ``flush`` once due, or dropped
        for a newer one): a bar gives a row per BAR_ROW_S, printed lines LINE_RATE a second in
        bursts of LINE_BURST. Eval rows (eval_loss, no loss) always go at once."""
        now = self.clock()
        if kind == "line" and self._again(row, now):
            return []
        if "eval_loss" in row and "loss" not in row:
            return [row]
        if kind == "bar":
            due = now if self.bar_at is None else self.bar_at + BAR_ROW_S
        else:
            self._refill(now)
            due = now if self.tokens >= 1 else now + (1 - self.tokens) / LINE_RATE
        if now < due:
            self.held = (row, due, kind)
            return []
        self.held = None
        self._spend(kind, now)
        return [row]

    def _again(self, row: Row, now: float) -> bool:
        """Whether a printed line with this row's step, epoch and kind was read within SAME_S:
        a script printing on every rank prints each line once per process."""
        while self.recent:  # oldest first: forget what is older than SAME_S, and past MAX_RECENT
            _, seen = next(iter(self.recent.items()))
            if now - seen <= SAME_S and len(self.recent) < MAX_RECENT:
                break
            self.recent.popitem(last=False)
        key = (row.get("step"), row.get("epoch"), "loss" in row, "eval_loss" in row)
        if key in self.recent:
            return True
        self.recent[key] = now
        return False

    def _refill(self, now: float) -> None:
        if self.tokens_at is not None:
            self.tokens = min(LINE_BURST, self.tokens + max(0.0, now - self.tokens_at) * LINE_RATE)
        self.tokens_at = now

    def _spend(self, kind: str, now: float) -> None:
        if kind == "bar":
            self.bar_at = now
        else:
            self._refill(now)
            self.tokens = max(0.0, self.tokens - 1)

    def _close_table(self) -> List[Row]:
        """HF's ``***** eval metrics *****`` table as an eval row at the last step seen (it is
        printed after training); other splits (train: the summary; test, predict) are no rows."""
        assert self.table is not None
        split, values, seen = self.table
        self.table = None
        row = to_row(values, self.last_step, self.total, "log", seen) if split == "eval" else None
        return [row] if row and "eval_loss" in row else []

    def _emit(self, step: Optional[int]) -> List[Row]:
        assert self.pending is not None
        logs, seen = self.pending
        self.pending = None
        row = to_row(logs, step, self.total, "hf-log", seen)
        return [row] if row else []

    def flush(self, older_than: float = 0.0) -> List[Row]:
        """What is waiting: a pending dict line (no bar came after it: the last known step) and
        an eval table when older than ``older_than``; a held-back row once due (always with
        ``older_than`` 0, as after the job ended)."""
        now = self.clock()
        rows: List[Row] = []
        if self.pending is not None and now - self.pending[1] >= older_than:
            rows += self._emit(self.step)
        if self.table is not None and now - self.table[2] >= older_than:
            rows += self._close_table()
        if self.held is not None and (older_than == 0 or now >= self.held[1]):
            row, _, kind = self.held
            self.held = None
            self._spend(kind, now)
            rows.append(row)
        return self._seen(rows)


def find_trainer_state(root: str) -> Optional[str]:
    """``trainer_state.json`` of the highest ``checkpoint-N/`` found breadth-first under
    ``root`` (``jobdir/scan.py``'s bounded walk, SCAN_DEPTH levels; a checkpoint folder is
    not entered)."""
    best: Optional[Tuple[int, str]] = None
    for _, entries in scan.folders(root, SCAN_DEPTH, enter=lambda e: _CHECKPOINT.match(e.name) is None):
        for entry in entries:
            m = _CHECKPOINT.match(entry.name)
            if m is None or not entry.is_dir(follow_symlinks=False):
                continue
            state = os.path.join(entry.path, "trainer_state.json")
            if (best is None or int(m.group(1)) > best[0]) and os.path.isfile(state):
                best = (int(m.group(1)), state)
    return best[1] if best else None


def state_rows(state: Dict[str, Any], after_train: float, after_eval: float, now: float) -> Tuple[List[Row], Optional[int]]:
    """(rows of ``log_history`` past the given steps, ``max_steps``) of a trainer_state.json."""
    total = number(state.get("max_steps"))
    total_steps = int(total) if total else None
    rows: List[Row] = []
    history = state.get("log_history")
    for entry in history if isinstance(history, list) else []:
        step = number(entry.get("step")) if isinstance(entry, dict) else None
        if step is None:
            continue
        after = after_train if "loss" in entry else after_eval
        if step > after:
            row = to_row(entry, step, total_steps, "hf-state", now)
            if row:
                rows.append(row)
    return rows, total_steps

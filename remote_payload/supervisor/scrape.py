"""Metrics rows for a user script from what it already prints (standard library only).

A user script that never writes ``metrics.jsonl`` itself still gets STEP/LOSS/ETA in
``orch status`` and curves in ``orch plot`` when it trains with Hugging Face ``Trainer``
(or anything printing the same lines). While the job runs, a thread in the supervisor
(``watch``) follows this node's log and appends recognised rows to ``<job_dir>/metrics.jsonl``
in the protocol of docs/own-script.md, each marked ``"source": "hf-log"`` or ``"hf-state"``:

- **log lines**: HF's ``{'loss': '2.31', 'grad_norm': ..., 'learning_rate': ..., 'epoch': ...}``
  (floats, or strings in transformers 5) and ``{'eval_loss': ...}``. They carry no step: the
  step and the total come from the training progress bar (``| 12/20 [``) that tqdm redraws
  right after each such line. A dict line with its own numeric ``step`` needs no bar.
- **trainer_state.json** in the newest ``checkpoint-N/`` within a few levels of the job
  folder (the snapshot ``code/`` included, where a relative ``output_dir`` lands): its
  ``max_steps`` is the total, and ``log_history`` entries newer than every row written
  so far are added (a run printing no bar still gets stepped rows at each checkpoint).

Contracts: the built-in trainer (a job with ``train.json``) is never watched: it writes its
own rows. A job that writes ``metrics.jsonl`` itself (``remote_payload.report`` or by hand)
wins: before every append the file must be exactly as this watcher left it, otherwise the
watcher stops adding rows for the rest of the attempt. Everything read is bounded (segment
length, bytes per poll, directories per scan, trainer_state.json size); the thread never
raises into the supervisor and never blocks the job. Set ``ORCH_METRICS_FROM_LOG=0`` in the
job's env to turn it off.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

POLL_S = 1.0
STATE_SCAN_S = 15.0
PENDING_MAX_S = 5.0  # a dict line no bar follows is written with the last known step after this
MAX_SEGMENT = 16 * 1024  # a longer line is never a metrics line
MAX_READ = 1 << 20  # log bytes per read
MAX_STATE_BYTES = 32 << 20
SCAN_DIRS, SCAN_ENTRIES, SCAN_DEPTH = 2000, 50000, 4
MAX_KEYS = 32
ALIASES = {"learning_rate": "lr"}
SKIP_SCAN = ("logs", "repro", "__pycache__", "node_modules")

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_BAR = re.compile(r"^\s*\d{1,3}%\|[^|]*\|\s*(\d+)/(\d+)\s*\[")  # tqdm without a description
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$")
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")

Row = Dict[str, Any]


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


def to_row(logs: Dict[Any, Any], step: Optional[float], total: Optional[int], source: str, now: float) -> Optional[Row]:
    """A protocol row from a HF logs dict: numeric values only, ``learning_rate`` as ``lr``;
    None unless it holds ``loss`` or ``eval_loss``."""
    row: Row = {"time": now}
    for key, value in list(logs.items())[:MAX_KEYS * 2]:
        value = number(value)
        if isinstance(key, str) and _KEY.match(key) and value is not None and len(row) <= MAX_KEYS:
            row[ALIASES.get(key, key)] = value
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


class LineParser:
    """Turns log text into rows. Pure apart from ``clock``; feed it any chunking."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.partial, self.skipping = "", False
        self.pending: Optional[Tuple[Dict[Any, Any], float]] = None
        self.step: Optional[int] = None
        self.total: Optional[int] = None

    def feed(self, text: str) -> List[Row]:
        rows: List[Row] = []
        pieces = re.split(r"[\r\n]", self.partial + text)
        self.partial = pieces.pop()
        for piece in pieces:
            if self.skipping:  # the tail of an over-long line
                self.skipping = False
                continue
            rows.extend(self._segment(piece))
        if len(self.partial) > MAX_SEGMENT:
            self.partial, self.skipping = "", True
        return rows

    def _segment(self, raw: str) -> List[Row]:
        segment = _ANSI.sub("", raw)
        bar = _BAR.match(segment)
        if bar:
            n, total = int(bar.group(1)), int(bar.group(2))
            rows: List[Row] = []
            if self.pending is not None:  # the redraw right after a dict line: that line's step
                self.step, self.total = n, total
                rows = self._emit(n)
            elif self.total is None or total == self.total:  # not an eval bar
                self.step = n
            return rows
        logs = parse_dict(segment) if segment.lstrip().startswith("{") else None
        if logs is None:
            return []
        rows = self.flush()
        if number(logs.get("step")) is not None:
            row = to_row(logs, None, self.total, "hf-log", self.clock())
            return rows + ([row] if row else [])
        self.pending = (logs, self.clock())
        return rows

    def _emit(self, step: Optional[int]) -> List[Row]:
        assert self.pending is not None
        logs, seen = self.pending
        self.pending = None
        row = to_row(logs, step, self.total, "hf-log", seen)
        return [row] if row else []

    def flush(self, older_than: float = 0.0) -> List[Row]:
        """Write a pending dict line with the last known step (no bar came after it)."""
        if self.pending is None or self.clock() - self.pending[1] < older_than:
            return []
        return self._emit(self.step)


def find_trainer_state(root: str) -> Optional[str]:
    """``trainer_state.json`` of the highest ``checkpoint-N/`` found breadth-first under
    ``root`` (at most SCAN_DIRS folders and SCAN_ENTRIES entries, SCAN_DEPTH levels, no
    hidden folders, no links followed)."""
    best: Optional[Tuple[int, str]] = None
    level, visited, seen = [root], 0, 0
    for _ in range(SCAN_DEPTH):
        nxt: List[str] = []
        for folder in level:
            visited += 1
            if visited > SCAN_DIRS or seen > SCAN_ENTRIES:
                return best[1] if best else None
            try:
                with os.scandir(folder) as entries:
                    names = [e for _, e in zip(range(SCAN_ENTRIES - seen + 1), entries)]
            except OSError:
                continue
            seen += len(names)
            for entry in names:
                if entry.name.startswith(".") or entry.name in SKIP_SCAN or not entry.is_dir(follow_symlinks=False):
                    continue
                m = _CHECKPOINT.match(entry.name)
                if m is None:
                    nxt.append(entry.path)
                    continue
                state = os.path.join(entry.path, "trainer_state.json")
                if (best is None or int(m.group(1)) > best[0]) and os.path.isfile(state):
                    best = (int(m.group(1)), state)
        level = nxt
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

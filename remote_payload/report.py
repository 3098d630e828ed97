"""Report training progress to orch from your own script (standard library only, Python >= 3.8).

Under orch the payload is on ``PYTHONPATH``, so a job's script can do, without installing
anything::

    from remote_payload.report import report
    report(step=10, loss=1.23, total_steps=1000, lr=3e-4)

Each call appends one JSON object as one line to ``$ORCH_METRICS`` (the supervisor sets it
to ``<job_dir>/metrics.jsonl``): ``orch status`` shows step/total, loss and ETA from the
newest line, ``orch plot`` draws every line. The format is documented in docs/own-script.md;
writing those lines yourself is just as good.

Contract: only the process with ``RANK`` 0 (or no ``RANK``) writes; each line goes out in one
``O_APPEND`` write, so concurrent writers never interleave inside a line; ``total_steps``
given once is repeated on every later line; ``attempt`` comes from ``$ORCH_ATTEMPT`` (1, 2,
..., set by orch on each attempt) when that is set; values that are not finite numbers
become ``null`` or are dropped; ``report`` never raises (it returns False when nothing was
written: another rank, no ``ORCH_METRICS``/``ORCH_JOB_DIR`` outside orch, or an I/O error).
This file has no orch imports: copy it into a project to use it elsewhere.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Dict, Optional

from remote_payload.contract import settings

MAX_KEYS = 64
MAX_KEY_LEN = 64

_state: Dict[str, Any] = {"total_steps": None}


def metrics_path() -> Optional[str]:
    """Where rows go: ``$ORCH_METRICS``, else ``$ORCH_JOB_DIR/metrics.jsonl``, else None."""
    path = settings.job_variable(settings.METRICS)
    if path:
        return path
    job_dir = settings.job_variable(settings.JOB_DIR)
    return os.path.join(job_dir, "metrics.jsonl") if job_dir else None


def is_main_rank() -> bool:
    return os.environ.get("RANK", "0").strip() in ("", "0")


def _value(value: Any) -> Any:
    """A JSON number (None when not finite); anything with ``__float__`` (numpy, 1-element
    tensors) is converted; other values are refused with ValueError."""
    if value is None or isinstance(value, bool):
        raise ValueError("not a number")
    if isinstance(value, int):
        return value
    number = float(value)
    return number if math.isfinite(number) else None


def report(step: int, loss: Optional[float] = None, *, total_steps: Optional[int] = None, **fields: Any) -> bool:
    """Append ``{"time", "step", "loss", "total_steps", "attempt", **fields}`` to the job's
    metrics file (``attempt``: ``$ORCH_ATTEMPT`` as an int, when set).

    ``fields``: ``lr``, ``eval_loss``, ``tokens_per_s``, ``epoch``, ``grad_norm`` or any other
    number. Returns True when the line was written."""
    try:
        if not is_main_rank():
            return False
        path = metrics_path()
        if not path:
            return False
        if total_steps is not None:
            _state["total_steps"] = int(total_steps)
        row: Dict[str, Any] = {"time": time.time(), "step": int(step)}
        if loss is not None:
            row["loss"] = _value(loss)
        if _state["total_steps"] is not None:
            row["total_steps"] = _state["total_steps"]
        attempt = settings.job_variable(settings.ATTEMPT).strip()
        if attempt.isascii() and attempt.isdigit() and len(attempt) <= 9:
            row["attempt"] = int(attempt)
        for key, value in list(fields.items())[:MAX_KEYS]:
            if len(key) <= MAX_KEY_LEN and key not in row:
                try:
                    row[key] = _value(value)
                except (TypeError, ValueError, OverflowError):
                    continue
        data = (json.dumps(row, allow_nan=False) + "\n").encode("utf-8")
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            written = os.write(fd, data)
        finally:
            os.close(fd)
        return written == len(data)
    except Exception:  # noqa: BLE001 - progress reporting must never break training
        return False

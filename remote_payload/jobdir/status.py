"""A job's state files read as untrusted input, and its processes (standard library only).

``read_status`` bounds and types status.json; ``survivors_of`` finds the processes of a job
whose supervisor died; ``last_metrics`` reads what ``orch status`` shows from the tail of
metrics.jsonl; ``kill_group`` stops a process group, ``kill_supervisor`` a supervisor deaf to SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any, Dict, List, Optional

from remote_payload.contract.jobfolder import read_json
from remote_payload.contract.protocol import ACTIVE, JOB_STATUS, TERMINAL, is_a
from remote_payload.jobdir import processes
from remote_payload.jobdir.processes import group_alive

MAX_STATUS_BYTES = 1 << 20
STATES = ACTIVE + TERMINAL  # the states a status.json may name


def read_status(path: str) -> Optional[Dict[str, Any]]:
    """status.json as a bounded, typed dict: a file over ``MAX_STATUS_BYTES``, not JSON, or
    with an unknown state reads as broken (``state: unknown`` with the reason); long strings
    and lists are cut, and a field of ``protocol.JOB_STATUS`` with the wrong type is left out,
    so no reply carries a job's junk or breaks on it. None when there is no file."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return None
    if size > MAX_STATUS_BYTES:
        return {"state": "unknown", "reason": "status.json is %d bytes: not written by orch" % size}
    st = read_json(path)
    if st is None:  # it exists (written atomically, never seen half-done) but is not JSON
        return {"state": "unknown", "reason": "status.json is not valid JSON"}
    if not isinstance(st, dict):
        return {"state": "unknown", "reason": "status.json is not an object"}
    out: Dict[str, Any] = {}
    for key, value in list(st.items())[:64]:
        if isinstance(value, str):
            value = value[:2000]
        elif isinstance(value, list):
            value = value[:4096]
        elif isinstance(value, dict):
            continue
        out[str(key)[:64]] = value
    if out.get("state") not in STATES:
        return {"state": "unknown", "reason": "status.json names no known state"}
    for key, (types, _) in JOB_STATUS.items():  # a field of the wrong type is dropped: the reply stays well-formed
        if key in out and not is_a(out[key], types):
            del out[key]
    return out


def survivors_of(st: Dict[str, Any]) -> List["processes.Proc"]:
    """The processes of the job's tree as the supervisor last recorded it that still run."""
    recorded = []
    for item in st.get("procs") or []:
        try:
            recorded.append((int(item[0]), int(item[1])))
        except (TypeError, ValueError, IndexError):
            continue
    return processes.alive(recorded)


def kill_group(pgid: int, grace: float) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + grace
    while time.time() < deadline:
        if not group_alive(pgid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.time() + 5
    while group_alive(pgid) and time.time() < deadline:
        time.sleep(0.05)


def kill_supervisor(pid: int, wait_s: float = 10.0) -> None:
    """SIGKILL a supervisor that did not stop on SIGTERM (its handler is Python: it cannot run
    while the process is stopped or stuck in C code holding the GIL) and wait, at most
    ``wait_s``, until it no longer runs (a zombie has ended)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.time() + wait_s
    while processes.pid_alive(pid, "supervisor") and time.time() < deadline:
        time.sleep(0.05)


def last_metrics(path: str) -> Optional[Dict[str, Any]]:
    """What ``orch status`` shows, from the last 32 KiB of metrics.jsonl (the built-in
    trainer's, a user script's, or rows the supervisor read from a HF Trainer log; format in
    docs/own-script.md): the newest training row (one with ``loss``), the newest eval row's
    ``eval_*`` merged in, ``step``/``time`` from a newer row without loss (progress only),
    and the newest ``total_steps`` when the training row has none. None when there is no
    such row yet."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 32768))
            lines = f.read().splitlines()
    except OSError:
        return None
    train: Optional[Dict[str, Any]] = None
    evaluation: Optional[Dict[str, Any]] = None
    latest: Optional[Dict[str, Any]] = None
    total: Any = None
    for line in reversed(lines):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if not isinstance(value, dict):
            continue
        if latest is None and _is_number(value.get("step")):
            latest = value
        if total is None and _is_number(value.get("total_steps")):
            total = value["total_steps"]
        if train is None and "loss" in value:
            train = value
        if evaluation is None and "eval_loss" in value:
            evaluation = value
        if train is not None and evaluation is not None and total is not None:
            break
    if train is None and evaluation is None and latest is None:
        return None
    out = dict(train or evaluation or latest or {})
    if evaluation is not None:
        out.update({k: v for k, v in evaluation.items() if k.startswith("eval_")})
    if latest is not None and "loss" not in latest and "eval_loss" not in latest \
            and (not _is_number(out.get("step")) or latest["step"] > out["step"]):
        out.update({k: latest[k] for k in ("step", "time") if k in latest})
    if total is not None and "total_steps" not in out:
        out["total_steps"] = total
    return out


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)

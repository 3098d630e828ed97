"""metrics.jsonl (rank 0), throughput accounting, MFU and peak memory.

Contract: `MetricsLog` appends one JSON object per call and flushes it, so a reader tailing the
file (the orchestrator's `orch status`) sees whole lines only. Non-main ranks write nothing.
A run that starts at step N (resumed from checkpoint N, or N = 0) first drops the rows an earlier
attempt wrote after step N (`drop_after`), so every step appears once: the file is rewritten to a
temporary file, fsynced and renamed over it, so a crash leaves either the old or the new file and
the rows up to step N are never lost.
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import sys
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

# Dense bf16/fp16 tensor-core peak FLOP/s per GPU, matched by substring of the device name
# (most specific first). MFU is reported only for these.
_PEAK_FLOPS = (
    ("H200", 989e12), ("H100", 989e12), ("H800", 989e12), ("H20", 148e12), ("GH200", 989e12),
    ("A100", 312e12), ("A800", 312e12), ("L40S", 362e12), ("L40", 181e12), ("L20", 119.5e12),
    ("A40", 149.7e12), ("A10", 125e12), ("L4", 121e12), ("4090", 165.2e12), ("3090", 71e12),
    ("V100", 125e12), ("T4", 65e12),
)


def device_peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16/fp16 peak, or None when unknown (CPUs, unlisted GPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in _PEAK_FLOPS if key in name), None)


def flops_per_token(n_params: int, n_trainable: int) -> float:
    """Training FLOPs per token: forward 2N, input-gradients 2N, weight-gradients 2N_trainable.

    Attention's sequence-length term is left out, so this undercounts for long sequences.
    """
    return 4.0 * n_params + 2.0 * n_trainable


def peak_memory_mb(device: torch.device) -> float:
    """Peak allocated accelerator memory, or the process's peak RSS on CPU, in MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


class Throughput:
    """Counts tokens between two `report` calls and turns them into rates."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.tokens = 0
        self.label_tokens = 0
        self.started = time.perf_counter()

    def add(self, tokens: int, label_tokens: int) -> None:
        self.tokens += tokens
        self.label_tokens += label_tokens

    def report(self, world_tokens: float, world_label_tokens: float) -> dict[str, float]:
        """Rates over the interval, given the interval's token counts summed over ranks; then reset."""
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        out = {"tokens_per_s": world_tokens / elapsed, "label_tokens_per_s": world_label_tokens / elapsed, "interval_s": elapsed}
        self._reset()
        return out


def drop_after(path: Path, step: int) -> int:
    """Rewrite `path` without the rows whose `step` is greater than `step` (an earlier attempt's
    steps after the checkpoint a run resumes from) and without a torn last line (no newline: a
    kill mid-write); every other line is kept byte for byte. Atomic (temporary file, fsync,
    rename); the file is left untouched when nothing is dropped. Returns the number of lines dropped."""
    try:
        lines = path.read_bytes().splitlines(keepends=True)
    except FileNotFoundError:
        return 0
    kept = [line for i, line in enumerate(lines) if not _after(line, step, last=i == len(lines) - 1)]
    if len(kept) == len(lines):
        return 0
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.writelines(kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself
    finally:
        os.close(fd)
    return len(lines) - len(kept)


def _after(line: bytes, step: int, last: bool) -> bool:
    """Whether `line` goes: a row of a later step, or a torn final line. A complete line that is
    not a JSON object with an integer `step` stays (never lose what cannot be read)."""
    if last and not line.endswith(b"\n"):
        return True
    try:
        row = json.loads(line)
    except ValueError:
        return False
    value = row.get("step") if isinstance(row, dict) else None
    return isinstance(value, int) and not isinstance(value, bool) and value > step


class MetricsLog:
    """Appends JSON lines to `path` on the main rank; a no-op elsewhere. `start_step`: the step
    the run starts at; rows after it are dropped first (`drop_after`)."""

    def __init__(self, path: Path, enabled: bool, start_step: int = 0) -> None:
        if enabled and (dropped := drop_after(path, start_step)):
            log.info("metrics.jsonl: dropped %d rows written after step %d by the interrupted attempt", dropped, start_step)
        self._file = path.open("a", encoding="utf-8") if enabled else None

    def write(self, record: dict[str, object]) -> None:
        if self._file is None:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        self._file.write(json.dumps({"time": time.time(), **clean}) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

"""`train.tensorboard: true`: the metrics.jsonl scalars as TensorBoard event files in `<job>/runs/`.

Contract: rank 0 only. `Board.open` returns a board that writes nothing when the option is off,
on other ranks, or when the server lacks the `tensorboard` package (then it says so once, at
start, as a warning: training goes on, metrics.jsonl has every number). Each numeric value of a
training row is written as `train/<key>` at its step, each of an evaluation row as
`eval/<key>` (`eval_loss` -> `eval/loss`), through torch.utils.tensorboard's SummaryWriter. A
resumed run opens the writer with purge_step = the checkpoint's step + 1, so TensorBoard drops
the steps the interrupted attempt logged after its checkpoint (as metrics.jsonl does).
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("remote_payload.train")
RUNS = "runs"


class Board:
    """A SummaryWriter under `<out>/runs/`, or nothing (see the module contract)."""

    def __init__(self, writer: object | None) -> None:
        self.writer = writer

    @classmethod
    def open(cls, enabled: bool, is_main: bool, out: Path, resumed_step: int | None) -> Board:
        if not (enabled and is_main):
            return cls(None)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            log.warning("train.tensorboard: no event files are written: the tensorboard package is not installed on this "
                        "server (%s); install it in the job's environment (pip install tensorboard, e.g. in setup:)", exc)
            return cls(None)
        purge = resumed_step + 1 if resumed_step is not None else None
        log.info("train.tensorboard: event files in %s", out / RUNS)
        return cls(SummaryWriter(log_dir=str(out / RUNS), purge_step=purge))

    def scalars(self, row: dict[str, object]) -> None:
        """Write `row`'s numbers at its step (a training or evaluation row of metrics.jsonl)."""
        if self.writer is None:
            return
        step = row["step"]
        for key, value in row.items():
            if key == "mix_seen" and isinstance(value, dict):  # data.mix: examples trained on, per source
                for name, n in value.items():
                    self.writer.add_scalar(f"mix/{name}", n, global_step=step)
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            tag = f"eval/{key.removeprefix('eval_')}" if key.startswith("eval_") else f"train/{key}"
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

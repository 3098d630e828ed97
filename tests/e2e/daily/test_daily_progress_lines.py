"""A script that only prints its own progress, nanoGPT style (plain python, no torch): the
supervisor turns its lines into metrics rows, so `orch status --json` has STEP/LOSS and
`orch plot` draws the curve after the job ended, through the real CLI on the `local` host."""

from __future__ import annotations

import json

from tests.support.orch import Orch, write_job

# nanoGPT's train.py prints exactly these two lines: the eval every eval_interval iterations
# (before that iteration's step), and one line per log_interval.
NANOGPT = """\
import time
max_iters, eval_interval, log_interval = 60, 20, 2
for iter_num in range(max_iters + 1):
    if iter_num % eval_interval == 0:
        print(f"step {iter_num}: train loss {4.0 - iter_num / 30:.4f}, val loss {4.1 - iter_num / 30:.4f}", flush=True)
    if iter_num % log_interval == 0:
        mfu = -100.0 if iter_num < 5 else 1.23
        print(f"iter {iter_num}: loss {4.0 - iter_num / 30:.4f}, time {30 + iter_num % 7:.2f}ms, mfu {mfu:.2f}%", flush=True)
    time.sleep(0.01)
"""


def run(orch: Orch, name: str, script: str) -> tuple[str, list[dict]]:
    """``python <name>.py`` on local, followed to its end (succeeded): its job id and metrics rows."""
    spec = write_job(orch.cwd, name, "local", ["python", f"{name}.py"])
    (orch.cwd / "ws" / f"{name}.py").write_text(script)
    done = orch("submit", str(spec), "--follow", "--json")
    result = json.loads(done.stdout)
    assert result["state"] == "succeeded", done.stderr[-3000:]
    job = result["job_id"]
    return job, [json.loads(line) for line in (orch.job_dir(job) / "metrics.jsonl").read_text().splitlines()]


def test_a_nanogpt_style_script_gets_status_and_plot(orch: Orch) -> None:
    job, rows = run(orch, "train", NANOGPT)
    assert {r["source"] for r in rows} == {"log"}
    assert [r["step"] for r in rows if "eval_loss" not in r] == list(range(0, 61, 2))
    assert [(r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r] == [(0, 4.1), (20, 3.4333), (40, 2.7667),
                                                                               (60, 2.1)]

    progress = orch.json("status", job)["progress"]
    assert (progress["step"], progress["loss"], progress["eval_loss"]) == (60, 2.0, 2.1)
    row = next(line for line in orch("status").stdout.splitlines() if line.startswith(job))
    assert " 60 " in row and " 2.0000 " in row

    out = orch("plot", job, "-o", "curves.png")
    assert "35 loss, 4 eval_loss, 0 lr, 0 tokens_per_s points" in out.stderr  # 31 iter lines + 4 eval lines
    from PIL import Image

    with Image.open(orch.cwd / "curves.png") as image:
        assert image.size == (800, 500)  # the loss panel alone: no empty lr or tokens/s panels


# Lightning with its defaults: rich is installed, so the Trainer draws RichProgressBar; the
# supervisor's TTY_COMPATIBLE/TTY_INTERACTIVE make it redraw into the log as on a terminal.
LIGHTNING = """\
import time
import torch
import lightning as L
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, i):
        time.sleep(1.0)  # a step that takes a while, as a real one does: Rich redraws the bar during each
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = TensorDataset(torch.randn(12, 4), torch.randn(12, 1))
trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False)
trainer.fit(Tiny(), DataLoader(data, batch_size=4))
"""


def test_a_lightning_script_with_the_default_bar_gets_status_and_plot(orch: Orch) -> None:
    job, rows = run(orch, "lit", LIGHTNING)
    log = (orch.job_dir(job) / "logs" / "node0.log").read_text(errors="replace")
    assert "Epoch 0/0" in log and "3/3" in log, log[-3000:]  # Rich's bar, not Lightning's tqdm one
    steps = [r["step"] for r in rows if "loss" in r]
    # the first redraw's row at once, the last one kept: a file gets only the end without the supervisor's env
    assert steps[0] == 1 and steps[-1] == 3 and steps == sorted(set(steps)), rows  # one row per step
    progress = orch.json("status", job)["progress"]
    assert progress["step"] == 3 and progress["loss"] == rows[-1]["loss"]

    out = orch("plot", job, "-o", "lit.png")
    assert f"{len(steps)} loss, 0 eval_loss" in out.stderr
    assert (orch.cwd / "lit.png").stat().st_size > 0

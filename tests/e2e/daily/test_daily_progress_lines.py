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


def test_a_nanogpt_style_script_gets_status_and_plot(orch: Orch) -> None:
    spec = write_job(orch.cwd, "nanogpt", "local", ["python", "train.py"])
    (orch.cwd / "ws" / "train.py").write_text(NANOGPT)
    done = orch("submit", str(spec), "--follow", "--json")
    result = json.loads(done.stdout)
    assert result["state"] == "succeeded", done.stderr[-3000:]
    job = result["job_id"]

    rows = [json.loads(line) for line in (orch.job_dir(job) / "metrics.jsonl").read_text().splitlines()]
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

"""A built-in trainer job with a data mixture, NEFTune, a workspace transform and TensorBoard,
through the CLI on `local`: orch show prints what each source gave and was trained on, and orch
fetch brings the job's runs/ event files when outputs: names them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.support.orch import Orch

JOB = """\
name: mixed
hosts: [local]
workspace: {path: ws}
launch: {nproc_per_node: 1}
outputs: [outputs/, runs/, metrics.jsonl]
train:
  model: assets/tiny-gpt2
  lora: {r: 4, dropout: 0.0, target_modules: [c_attn]}
  data:
    mix:
      - {train: assets/data/train.jsonl, weight: 3, format: alpaca, eval: assets/data/eval.jsonl}
      - {train: assets/data/text.jsonl, weight: 1, format: text}
    mix_strategy: undersample
    neftune_alpha: 5.0
    transform: "shout:upper"
    max_length: 48
  precision: fp32
  batch_size: 4
  max_steps: 4
  log_every: 2
  eval_every: 4
  save_every: 100
  tensorboard: true
"""

SHOUT = '''\
def upper(example, rng):
    """Text examples shouted; alpaca ones as they are."""
    return dict(example, text=example["text"].upper()) if "text" in example else example
'''


def test_a_mixture_job_is_shown_per_source_and_its_tensorboard_files_fetched(orch: Orch, tiny_assets: Path) -> None:
    shutil.copytree(tiny_assets, orch.cwd / "ws" / "assets")
    (orch.cwd / "ws" / "shout.py").write_text(SHOUT)
    (orch.cwd / "job.yaml").write_text(JOB)
    job = json.loads(orch("submit", "job.yaml", "--follow", "--json").stdout)["job_id"]
    shown = orch("show", job).stdout
    # undersample 3:1 of 512 + 512: 512 / 0.75 = 682 examples, 512 and 170
    assert "data mix: undersample, 16 examples trained on by step 4" in shown, shown
    lines = {line.split(" (")[0].strip(): line for line in shown.splitlines() if line.startswith("  assets/data/")}
    assert "weight 3.0 (75.0%), 512 of 512 drawn per epoch" in lines["assets/data/train.jsonl"]
    assert "weight 1.0 (25.0%), 170 of 512 drawn per epoch" in lines["assets/data/text.jsonl"]
    orch("fetch", job)
    run = orch.cwd / "runs" / job
    events = EventAccumulator(str(run / "runs"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sum(rows[1]["mix_seen"].values()) == 16 and any("eval_loss" in r for r in rows)

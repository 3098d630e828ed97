"""train.tensorboard: the built-in trainer's event files, read by TensorBoard's own loader, hold
metrics.jsonl's numbers; a server without the tensorboard package is told so at start."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from remote_payload.trainer import board
from tests.support.trainer import base_config, metrics, run


def test_event_files_hold_the_metrics(assets: Path, tmp_path: Path) -> None:
    cfg = base_config(max_steps=4, log_every=2, eval_every=4, save_every=100, tensorboard=True,
                      data={"mix": [{"train": "data/train.jsonl", "weight": 1, "eval": "data/eval.jsonl"},
                                    {"train": "data/text.jsonl", "weight": 1, "format": "text"}], "max_length": 64})
    out = tmp_path / "job"
    done = run(out, cfg, assets, nproc=2)
    assert done.returncode == 0, done.stdout
    events = EventAccumulator(str(out / "runs"))
    events.Reload()
    rows = metrics(out)
    trained = [m for m in rows if "loss" in m]
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [
        (m["step"], pytest.approx(m["loss"], rel=1e-6)) for m in trained]
    assert [e.step for e in events.Scalars("train/lr")] == [2, 4]
    [evaluated] = [m for m in rows if "eval_loss" in m]
    assert [(e.step, e.value) for e in events.Scalars("eval/loss")] == [(4, pytest.approx(evaluated["eval_loss"], rel=1e-6))]
    assert [e.value for e in events.Scalars("mix/data/text.jsonl")] == [m["mix_seen"]["data/text.jsonl"] for m in trained]


def test_without_tensorboard_the_run_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as on a server without it
    with caplog.at_level(logging.INFO, logger="remote_payload.train"):
        b = board.Board.open(True, True, tmp_path, None)
        b.scalars({"step": 1, "loss": 1.0})
        b.close()
    assert b.writer is None and not (tmp_path / "runs").exists()
    assert "the tensorboard package is not installed on this server" in caplog.text
    assert board.Board.open(False, True, tmp_path, None).writer is None
    assert board.Board.open(True, False, tmp_path, None).writer is None  # other ranks write nothing

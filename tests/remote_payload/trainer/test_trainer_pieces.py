"""The loop's pieces (trainsetup.setup → micro_batches / train_step → Book → finish) called one at
a time in this process, as the module contracts state them; the torchrun tests cover them together."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from remote_payload.contract.train_config import TrainConfig
from remote_payload.trainer import distributed
from remote_payload.trainer import loop as train
from remote_payload.trainer import setup as trainsetup
from tests.support.trainer import base_config

CPU_ONE = distributed.DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def test_setup_step_book_and_finish_each_do_their_part(assets: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(assets)
    cfg = TrainConfig.model_validate(base_config(max_steps=3, warmup_steps=0, log_every=100, eval_every=100, save_every=100))
    run = trainsetup.setup(cfg, tmp_path, CPU_ONE)
    assert (run.progress.step, run.resumed, run.total_steps, run.model is run.raw_model) == (0, False, 3, True)
    assert run.params and all(p.requires_grad for p in run.params)
    book = train.Book(run)
    micro = next(train.micro_batches(run))
    assert len(micro) == cfg.grad_accum and micro[0].input_ids.shape[0] == cfg.batch_size
    before = [p.detach().clone() for p in run.params]

    stop = SimpleNamespace(requested=False)
    lr, grad_norm, stopping = train.train_step(run, micro, book.interval, stop)
    assert run.progress.step == 1 and run.progress.tokens_seen == sum(b.n_tokens for b in micro) and not stopping
    assert lr == cfg.lr and float(grad_norm) > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, run.params))
    book.report(lr, grad_norm)
    book.save()
    assert (tmp_path / "checkpoints" / "step-1" / "COMPLETE").is_file()

    micro = next(train.micro_batches(run))  # a stop vote: the step is still taken, and reported as the last
    stop.requested = True
    assert train.train_step(run, micro, book.interval, stop)[2] is True and run.progress.step == 2
    stop.requested = False
    for micro in train.micro_batches(run):  # the rest, as train() runs it
        lr, grad_norm, _ = train.train_step(run, micro, book.interval, stop)
        book.after_step(lr, grad_norm)
    assert train.finish(run, book, None) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 3] and "export" in rows[-1]
    assert (tmp_path / "outputs" / "adapter_model.safetensors").is_file()

    again = trainsetup.setup(cfg, tmp_path, CPU_ONE)  # setup resumes from the latest checkpoint
    assert again.resumed and again.progress.step == 3 and list(train.micro_batches(again)) == []

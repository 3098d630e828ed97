"""Packing (`data.packing`) and length-grouped batches (`data.group_by_length`).

Packing must not change the loss: the same examples give the same per-token losses packed as one
per row (CPU, fp32, sdpa and eager), a packed step equals the unpacked step over the same examples
and 2 ranks x GA 2 equal 1 rank (real torchrun, gloo), and a SIGKILLed packed or grouped run
resumes bit-identical. Models load with from_pretrained from the tiny local fixture.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from remote_payload.trainer import data
from remote_payload.trainer import model as modeling
from tests.remote_payload.trainer.test_trainer_resume import (
    assert_bit_identical,
    assert_resumes_bit_identical,
    kill_after_checkpoint,
)
from tests.support.trainer import base_config, metrics, run, train_losses


@pytest.fixture(scope="module")
def tokenizer(assets: Path):
    return AutoTokenizer.from_pretrained(assets / "tiny-gpt2-nodrop")


@pytest.fixture(scope="module")
def examples(tokenizer, assets: Path) -> list[data.Example]:
    return data.load_examples(assets / "data" / "train.jsonl", "alpaca", tokenizer, 64)


# ---- packing: rows


def test_pack_places_every_example_once_whole_and_within_max_length(examples: list[data.Example]) -> None:
    rows = data.pack(examples, 64, seed=42)
    packed = [e for r in rows for e in r.examples]
    assert sorted(map(id, packed)) == sorted(map(id, examples))
    assert all(len(r) <= 64 for r in rows) and len(rows) < len(examples) / 2
    assert data.pack(examples, 64, seed=42) == rows  # deterministic under the seed
    assert sorted(map(len, data.pack(examples, 64, seed=7))) == sorted(map(len, rows))


def test_packed_batch_restarts_positions_and_no_label_crosses_a_boundary(examples: list[data.Example]) -> None:
    rows = data.pack(examples, 64, seed=0)[:4]
    batch = data.collate_packed(rows, pad_id=0)
    for r, row in enumerate(rows):
        at = 0
        for k, e in enumerate(row.examples):
            n = len(e.input_ids)
            assert batch.position_ids[r, at : at + n].tolist() == list(range(n))
            assert (batch.segment_ids[r, at : at + n] == k).all()
            assert batch.targets[r, at : at + n - 1].tolist() == e.labels[1:]
            assert batch.targets[r, at + n - 1] == data.IGNORE  # the next example's first token is no target
            at += n
        assert (batch.targets[r, at:] == data.IGNORE).all() and (batch.attention_mask[r, at:] == 0).all()
    assert batch.n_label_tokens == sum(1 for r in rows for e in r.examples for t in e.labels[1:] if t != data.IGNORE)
    assert batch.n_tokens == sum(map(len, rows)) == int(batch.attention_mask.sum())


def _token_losses(model: torch.nn.Module, batch: data.Batch, mode: str | None) -> torch.Tensor:
    inputs, targets = modeling.forward_inputs(batch, mode)
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=data.IGNORE, reduction="none").view(targets.shape)


@pytest.mark.parametrize(("attn", "mode"), [("sdpa", "bool_mask"), ("eager", "additive_mask"), ("sdpa", "position_ids")])
def test_packed_losses_equal_one_example_per_row(assets: Path, examples: list[data.Example], attn: str, mode: str) -> None:
    model = AutoModelForCausalLM.from_pretrained(assets / "tiny-gpt2-nodrop", dtype=torch.float32, attn_implementation=attn).eval()
    if mode != "position_ids":
        assert modeling.packing_mode(model) == mode
    chosen = examples[:24]
    rows = data.pack(chosen, 64, seed=1)
    assert max(len(r.examples) for r in rows) >= 2
    packed = data.collate_packed(rows, pad_id=0)
    packed_losses = _token_losses(model, packed, mode)
    unpacked = data.collate(chosen, pad_id=0)  # one example per row, right-padded, no mask
    unpacked_losses = _token_losses(model, unpacked, None)
    where = {id(e): i for i, e in enumerate(chosen)}
    for r, row in enumerate(rows):
        at = 0
        for e in row.examples:
            n = len(e.input_ids)
            torch.testing.assert_close(packed_losses[r, at : at + n - 1], unpacked_losses[where[id(e)], : n - 1], atol=2e-5, rtol=1e-5)
            at += n
    assert packed.n_label_tokens == unpacked.n_label_tokens and packed.n_tokens == unpacked.n_tokens
    assert packed_losses.sum().item() == pytest.approx(unpacked_losses.sum().item(), rel=1e-6)

    # The control: the same rows as plain concatenations (no restarts, no mask) do change the losses.
    naive = data.Batch(packed.input_ids, packed.attention_mask, packed.targets, packed.n_tokens, packed.n_label_tokens)
    assert (_token_losses(model, naive, None) - packed_losses).abs().max() > 1e-2


# ---- group_by_length: order


def _batches(units: list, **kw) -> list[list[int]]:
    return [b.input_ids[:, 0].tolist() for b in data.train_batches(units, pad_id=0, group_by_length=True, **kw)]


def test_grouped_order_is_deterministic_resumable_and_disjoint_over_ranks() -> None:
    tagged = [data.Example([1000 + i] * (1 + i * 7 % 40), [1000 + i] * (1 + i * 7 % 40)) for i in range(200)]
    kw = dict(world_size=2, batch_size=4, seed=3)
    assert _batches(tagged, rank=0, epoch=0, start=0, **kw) == _batches(tagged, rank=0, epoch=0, start=0, **kw)
    assert _batches(tagged, rank=0, epoch=0, start=0, **kw) != _batches(tagged, rank=0, epoch=1, start=0, **kw)
    assert _batches(tagged, rank=1, epoch=2, start=5, **kw) == _batches(tagged, rank=1, epoch=2, start=0, **kw)[5:]
    seen = [sum(_batches(tagged, rank=r, epoch=0, start=0, **kw), []) for r in range(2)]
    assert len(seen[0]) == len(seen[1]) == 4 * data.batches_per_epoch(200, 2, 4) and not set(seen[0]) & set(seen[1])


def test_grouping_by_length_cuts_padding(examples: list[data.Example]) -> None:
    def slots(group: bool) -> int:
        return sum(b.input_ids.numel() for b in data.train_batches(examples, rank=0, world_size=1, batch_size=8, seed=0, epoch=0,
                                                                    start=0, pad_id=0, group_by_length=group))
    assert slots(True) < 0.9 * slots(False)


# ---- under torchrun


def _rows_for(tokenizer, assets: Path) -> tuple[int, int]:
    """A training subset size whose packed rows split evenly over 2 ranks x GA 2: (examples, rows)."""
    for n in range(16, 64):
        ex = data.load_examples(assets / "data" / "train.jsonl", "alpaca", tokenizer, 64, sample=n, seed=42)
        if len(rows := data.pack(ex, 64, seed=42)) % 4 == 0:
            return n, len(rows)
    raise AssertionError("no subset size packs into a multiple of 4 rows")


def test_a_packed_step_equals_the_unpacked_step_and_ranks_times_ga_match(assets: Path, tmp_path: Path, tokenizer) -> None:
    n, n_rows = _rows_for(tokenizer, assets)
    common = dict(model="tiny-gpt2-nodrop", finetune="full", lora=None, max_steps=1, log_every=1, warmup_steps=0)
    d = {"train": "data/train.jsonl", "max_length": 64, "sample": n}
    runs = {  # name: (processes, batch_size, grad_accum, packing); every run sees the same n examples in its one step
        "unpacked": (1, n, 1, False), "packed": (1, n_rows, 1, True), "packed-2x-ga2": (2, n_rows // 4, 2, True),
    }
    first, progress = {}, {}
    for name, (nproc, batch, ga, packing) in runs.items():
        out = tmp_path / name
        result = run(out, base_config(**common, data={**d, "packing": packing}, batch_size=batch, grad_accum=ga), assets, nproc=nproc)
        assert result.returncode == 0, result.stdout
        first[name] = next(m for m in metrics(out) if "loss" in m)
        progress[name] = json.loads((out / "checkpoints" / "step-1" / "progress.json").read_text())
    for name in runs:
        assert first[name]["loss"] == pytest.approx(first["unpacked"]["loss"], rel=1e-5)
        assert first[name]["grad_norm"] == pytest.approx(first["unpacked"]["grad_norm"], rel=1e-4)
        if runs[name][0] == 1:  # progress.json counts rank 0's tokens
            assert progress[name]["label_tokens_seen"] == progress["unpacked"]["label_tokens_seen"]  # the useful tokens
            assert progress[name]["tokens_seen"] == progress["unpacked"]["tokens_seen"]
        # useful tokens: the non-padding ones; alpaca prompts get attention but no loss, so more than the labels
        assert first[name]["useful_tokens_per_s"] == first[name]["tokens_per_s"] > first[name]["label_tokens_per_s"] > 0
        assert first[name]["peak_mem_mb_per_rank"] and len(first[name]["peak_mem_mb_per_rank"]) == runs[name][0]
        assert first[name]["peak_mem_mb"] == max(first[name]["peak_mem_mb_per_rank"]) > 0
    assert first["packed"]["padding_fraction"] < first["unpacked"]["padding_fraction"]


@pytest.mark.parametrize(("nproc", "finetune", "option"), [(2, "full", "packing"), (1, "lora", "packing"), (2, "full", "group_by_length")])
def test_a_killed_packed_or_grouped_run_resumes_bit_identical(assets: Path, tmp_path: Path, nproc: int, finetune: str, option: str) -> None:
    # Dropout on (model 0.1, LoRA 0.1); 60 steps span several epochs, so the per-epoch order matters.
    extra = {"lora": {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["c_attn", "c_fc"]}} if finetune == "lora" else {"lora": None}
    cfg = base_config(finetune=finetune, **extra, max_steps=60, save_every=10, keep_checkpoints=20, log_every=10, eval_every=30,
                      data={"train": "data/train.jsonl", "eval": "data/eval.jsonl", "max_length": 64, option: True})
    ref = tmp_path / "ref"
    result = run(ref, cfg, assets, nproc=nproc)
    assert result.returncode == 0, result.stdout
    if option == "packing":
        assert "packing 512 examples into" in result.stdout
    assert max(m["epoch"] for m in metrics(ref) if "loss" in m) >= 1

    job = tmp_path / "job"
    kill_after_checkpoint(job, cfg, assets, nproc, 10)
    assert_resumes_bit_identical(ref, job, cfg, assets, nproc)
    assert_bit_identical(ref / "checkpoints" / "step-60", job / "checkpoints" / "step-60")
    assert train_losses(ref)[-1] == train_losses(job)[-1]

"""`strategy: fsdp` under real torchrun (2 processes, gloo, CPU, fp32): LoRA and full fine-tuning
train and export loadable models matching DDP's, and a run killed after a checkpoint resumes
bit-identical."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.remote_payload.trainer.test_trainer_resume import assert_kill_and_resume_match, weights
from tests.support.trainer import base_config, run, train_losses


@pytest.mark.parametrize("finetune", ["lora", "full"])
def test_fsdp_trains_exports_loadable_models_and_matches_ddp(assets: Path, tmp_path: Path, finetune: str) -> None:
    """FSDP and DDP compute the same step: the same global gradient (reduce-scatter of the same
    per-rank sums instead of an all-reduce), the same elementwise AdamW on each shard. They are
    not bit-identical: the reduction and the global grad norm are summed in a different order
    (per shard, then across ranks), so weights agree to float tolerance, not exactly."""
    extra = {} if finetune == "lora" else {"lora": None}
    cfg = base_config(model="tiny-gpt2-nodrop", finetune=finetune, **extra, max_steps=12, grad_accum=2, log_every=3,
                      eval_every=6, save_every=6)
    runs, logs = {}, {}
    for strategy in ("fsdp", "ddp"):
        runs[strategy] = tmp_path / strategy
        result = run(runs[strategy], {**cfg, "strategy": strategy}, assets, nproc=2)
        assert result.returncode == 0, result.stdout
        logs[strategy] = result.stdout
    assert "fsdp: sharded 2 GPT2Block blocks and the root over 2 processes" in logs["fsdp"]
    losses = train_losses(runs["fsdp"])
    assert losses[-1] < losses[0]
    assert losses == pytest.approx(train_losses(runs["ddp"]), rel=1e-4)

    # The same checkpoint and export layout as DDP, with the same parameter names, within float tolerance.
    for folder in ("outputs", "checkpoints/step-12"):
        a, b = weights(runs["fsdp"] / folder), weights(runs["ddp"] / folder)
        assert a.keys() == b.keys() and a
        for key in a:
            torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)
    assert sorted(p.name for p in (runs["fsdp"] / "checkpoints" / "step-12").iterdir()) == \
        sorted(p.name for p in (runs["ddp"] / "checkpoints" / "step-12").iterdir())

    from transformers import AutoModelForCausalLM

    if finetune == "lora":
        from peft import PeftModel

        base = AutoModelForCausalLM.from_pretrained(assets / "tiny-gpt2-nodrop")
        model = PeftModel.from_pretrained(base, runs["fsdp"] / "outputs")
    else:
        model = AutoModelForCausalLM.from_pretrained(runs["fsdp"] / "outputs")
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.isfinite(model(input_ids=ids).logits).all()


def test_fsdp_run_killed_after_a_checkpoint_resumes_bit_identical(assets: Path, tmp_path: Path) -> None:
    # Dropout on (the default tiny model) so RNG state must be restored; full fine-tuning so the
    # whole model's sharded AdamW state goes through the full-state-dict round trip.
    cfg = base_config(finetune="full", lora=None, strategy="fsdp", max_steps=30, save_every=10, keep_checkpoints=5,
                      log_every=10, eval_every=15)
    assert_kill_and_resume_match(tmp_path, cfg, assets, 2, 10)


def test_fsdp_refuses_fp16_with_a_clear_error(assets: Path, tmp_path: Path) -> None:
    result = run(tmp_path, base_config(strategy="fsdp", precision="fp16", max_steps=2), assets, nproc=2)
    assert result.returncode != 0
    assert "strategy: fsdp does not support fp16" in result.stdout

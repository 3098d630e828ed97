"""`strategy: deepspeed` under real torchrun (2 processes, gloo, CPU, fp32): DeepSpeed's CPU
accelerator runs ZeRO-2 and ZeRO-3 (also with optimizer and parameter offload and DeepSpeedCPUAdam)
here: both match DDP's losses and export the plain Hugging Face folder DDP exports (the same
logits through from_pretrained), and both, killed after a checkpoint, resume bit-identical."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.remote_payload.trainer.test_trainer_resume import assert_kill_and_resume_match, weights
from tests.support.trainer import base_config, run, train_losses

ZERO2 = {"zero_stage": 2}
ZERO3_OFFLOAD = {"zero_stage": 3, "offload_optimizer": True, "offload_params": True}


@pytest.mark.parametrize("zero", [ZERO2, ZERO3_OFFLOAD], ids=["zero2", "zero3-offload"])
def test_deepspeed_matches_ddp_and_exports_a_plain_folder(assets: Path, tmp_path: Path, zero: dict) -> None:
    """The same token-weighted gradient as DDP (DeepSpeed averages over ranks, the trainer weights
    the loss exactly before its backward), clipped by DeepSpeed: losses and exported weights agree
    to float tolerance (a different reduction order, and CPU Adam under offload)."""
    cfg = base_config(model="tiny-gpt2-nodrop", finetune="full", lora=None, max_steps=8, grad_accum=2, log_every=2,
                      eval_every=4, save_every=4, max_grad_norm=0.5)
    runs = {}
    for name, extra in (("deepspeed", {"strategy": "deepspeed", "deepspeed": zero}), ("ddp", {})):
        runs[name] = tmp_path / name
        result = run(runs[name], {**cfg, **extra}, assets, nproc=2)
        assert result.returncode == 0, result.stdout
        if name == "deepspeed":
            assert f"deepspeed: ZeRO stage {zero['zero_stage']}" in result.stdout
    assert train_losses(runs["deepspeed"]) == pytest.approx(train_losses(runs["ddp"]), rel=1e-4)

    ds, ddp = weights(runs["deepspeed"] / "outputs"), weights(runs["ddp"] / "outputs")
    assert ds.keys() == ddp.keys() and not any(k.startswith("module.") for k in ds)
    for key in ds:
        assert ds[key].dtype == torch.float32
        torch.testing.assert_close(ds[key], ddp[key], rtol=1e-4, atol=1e-5, msg=key)
    # DeepSpeed's own sharded state sits in the checkpoint, one optimizer partition per rank.
    shards = sorted(p.name for p in (runs["deepspeed"] / "checkpoints" / "step-8" / "deepspeed" / "state").iterdir())
    assert [s for s in shards if s.endswith("optim_states.pt")] == \
        ["zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]

    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    logits = {name: AutoModelForCausalLM.from_pretrained(runs[name] / "outputs").eval()(input_ids=ids).logits
              for name in runs}
    torch.testing.assert_close(logits["deepspeed"], logits["ddp"], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("zero", [ZERO2, {"zero_stage": 3}], ids=["zero2", "zero3"])
def test_deepspeed_run_killed_after_a_checkpoint_resumes_bit_identical(assets: Path, tmp_path: Path, zero: dict) -> None:
    # Dropout on (the default tiny model) so the RNG state must be restored; full fine-tuning, so
    # every weight's optimizer partition goes through DeepSpeed's checkpoint. (With offload_optimizer
    # the resumed run is not bit-identical yet: docs/trainer.md, DeepSpeed.)
    cfg = base_config(finetune="full", lora=None, strategy="deepspeed", deepspeed=zero, max_steps=60, grad_accum=2, save_every=10,
                      keep_checkpoints=10, log_every=10, eval_every=30)
    _, job = assert_kill_and_resume_match(tmp_path, cfg, assets, 2, 10)
    assert json.loads((job / "checkpoints" / "step-60" / "progress.json").read_text())["step"] == 60


def test_deepspeed_json_config_is_checked_against_the_job(assets: Path, tmp_path: Path) -> None:
    """A DeepSpeed JSON file with "auto" runs with the job's values; one that contradicts the job
    is refused before training (exit 2), naming the file, line and key."""
    (tmp_path / "ds.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto",
                                                  "zero_optimization": {"stage": 2, "overlap_comm": True}}, indent=1))
    cfg = base_config(strategy="deepspeed", deepspeed=str(tmp_path / "ds.json"), max_steps=2)
    result = run(tmp_path / "ok", cfg, assets, nproc=2)
    assert result.returncode == 0, result.stdout
    assert "deepspeed: ZeRO stage 2" in result.stdout

    (tmp_path / "bad.json").write_text('{\n "train_micro_batch_size_per_gpu": 4,\n "zero_optimization": {"stage": 2}\n}\n')
    result = run(tmp_path / "bad", {**cfg, "deepspeed": str(tmp_path / "bad.json")}, assets, nproc=2)
    assert result.returncode != 0
    assert f"deepspeed.config {tmp_path / 'bad.json'}: line 2: train_micro_batch_size_per_gpu: 4 differs from " \
           "train.batch_size (8)" in result.stdout
    assert "remote_payload/trainer" not in result.stdout  # no worker traceback (torchrun prints its own failure)

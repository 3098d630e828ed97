"""data.neftune_alpha: the noise of transformers' Trainer (neftune_noise_alpha) on the same model and
batch, in training forwards only; under real torchrun it changes the training losses and leaves
evaluation and the exported weights alone."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainerCallback, TrainingArguments

from remote_payload.contract.train_config import TrainConfig
from remote_payload.trainer import data, neftune
from remote_payload.trainer import loop as train
from tests.support.trainer import base_config, metrics, run

ALPHA = 5.0
BATCH, LENGTH = 8, 48


def capture_noise(embeddings: torch.nn.Module, into: list[torch.Tensor]) -> torch.utils.hooks.RemovableHandle:
    """A forward hook registered after the NEFTune one: what it added to the embedding lookup."""
    def hook(module: torch.nn.Module, args: tuple, output: torch.Tensor) -> None:
        into.append((output - torch.nn.functional.embedding(args[0], module.weight)).detach())
    return embeddings.register_forward_hook(hook)


def batch_ids(vocab: int) -> torch.Tensor:
    return (torch.arange(BATCH * LENGTH).view(BATCH, LENGTH) * 7 + 3) % vocab


def stats(noise: torch.Tensor) -> tuple[float, float, float]:
    return float(noise.abs().max()), float(noise.mean()), float(noise.std())


def test_the_noise_is_trainers_neftune_noise(assets: Path, tmp_path: Path) -> None:
    folder = assets / "tiny-gpt2-nodrop"
    ids = batch_ids(AutoModelForCausalLM.from_pretrained(folder).config.vocab_size)
    rows = [{"input_ids": r, "labels": r, "attention_mask": torch.ones_like(r)} for r in ids]

    theirs: list[torch.Tensor] = []

    class Capture(TrainerCallback):  # on_train_begin runs after Trainer attached its NEFTune hook
        def on_train_begin(self, args, state, control, model=None, **kwargs):  # noqa: ANN001, ANN003
            capture_noise(model.get_input_embeddings(), theirs)

    args = TrainingArguments(output_dir=str(tmp_path / "hf"), neftune_noise_alpha=ALPHA, max_steps=1,
                             per_device_train_batch_size=BATCH, learning_rate=1e-9, report_to=[], use_cpu=True,
                             save_strategy="no", logging_strategy="no", seed=0, disable_tqdm=True)
    Trainer(model=AutoModelForCausalLM.from_pretrained(folder), args=args, train_dataset=rows,
            callbacks=[Capture()]).train()
    assert len(theirs) == 1 and theirs[0].shape == (BATCH, LENGTH, 64)

    model = AutoModelForCausalLM.from_pretrained(folder)
    neftune.activate(model, ALPHA)
    ours: list[torch.Tensor] = []
    capture_noise(model.get_input_embeddings(), ours)
    model.train()
    torch.manual_seed(1)
    model(input_ids=ids)
    model.eval()
    model(input_ids=ids)  # eval mode: no noise at all
    assert len(ours) == 2 and torch.equal(ours[1], torch.zeros_like(ours[1]))

    scale = ALPHA / math.sqrt(LENGTH * 64)  # the paper's alpha / sqrt(L d); uniform(-scale, scale): std scale / sqrt(3)
    for noise in (theirs[0], ours[0]):
        top, mean, std = stats(noise)
        assert 0.99 * scale < top <= scale * (1 + 1e-6)
        assert abs(mean) < 0.02 * scale
        assert abs(std - scale / math.sqrt(3)) < 0.02 * scale
    assert abs(stats(ours[0])[2] - stats(theirs[0])[2]) < 0.02 * scale


def eval_loss_of(folder: Path, assets: Path) -> float:
    """The token-weighted eval loss of the exported model, computed here with no NEFTune anywhere."""
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(assets / "tiny-gpt2")
    examples = data.load_examples(assets / "data" / "eval.jsonl", "alpaca", tokenizer, 64)
    model.eval()
    total = count = 0.0
    with torch.no_grad():
        for b in range(0, len(examples), 8):
            batch = data.collate(examples[b : b + 8], tokenizer.pad_token_id)
            total += float(train.loss_sum(model, batch, torch.autocast("cpu", enabled=False)))
            count += batch.n_label_tokens
    return total / count


def test_neftune_changes_training_losses_not_eval_or_export(assets: Path, tmp_path: Path) -> None:
    cfg = base_config(model="tiny-gpt2-nodrop", finetune="full", lora=None, max_steps=6, log_every=1, eval_every=100,
                      save_every=100, lr=1e-3)
    noisy = dict(cfg, data=dict(cfg["data"], neftune_alpha=ALPHA))
    TrainConfig.model_validate(noisy)
    plain_out, noisy_out = tmp_path / "plain", tmp_path / "noisy"
    for out, c in ((plain_out, cfg), (noisy_out, noisy)):
        done = run(out, c, assets, nproc=2)
        assert done.returncode == 0, done.stdout
    assert "NEFTune: noise alpha 5" in (done.stdout or "")
    plain = [m["loss"] for m in metrics(plain_out) if "loss" in m]
    noised = [m["loss"] for m in metrics(noisy_out) if "loss" in m]
    assert len(plain) == len(noised) == 6 and plain[0] != noised[0]  # step 1: same weights, noisy inputs
    logged = [m["eval_loss"] for m in metrics(noisy_out) if "eval_loss" in m][-1]
    assert abs(eval_loss_of(noisy_out / "outputs", assets) - logged) < 1e-5 * logged  # eval had no noise
    exported = AutoModelForCausalLM.from_pretrained(noisy_out / "outputs").train()  # nothing of NEFTune came along
    ids = batch_ids(exported.config.vocab_size)[:2]
    with torch.no_grad():
        assert torch.equal(exported(input_ids=ids).logits, exported(input_ids=ids).logits)

"""Memory options (memory.gradient_checkpointing, memory.quantize) and peak memory per rank.

Gradient checkpointing runs for real under torchrun and must leave losses and weights as they
were (dropout on: its masks are replayed) while keeping fewer activations; QLoRA needs CUDA and
bitsandbytes, so here the trainer must refuse it before loading anything, saying why, and the
parts that do not need a GPU (loading arguments, merging into a fresh base) are checked on CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from remote_payload.contract.train_config import TrainConfig
from remote_payload.trainer import data, distributed, export, quantize
from remote_payload.trainer import setup as trainsetup
from remote_payload.trainer.loop import loss_sum
from tests.support.trainer import base_config, metrics, run

CPU_ONE = distributed.DistInfo(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted((out / "outputs").glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.parametrize(("nproc", "finetune"), [(2, "full"), (1, "lora")])
def test_gradient_checkpointing_leaves_losses_and_weights_unchanged(assets: Path, tmp_path: Path, nproc: int,
                                                                    finetune: str) -> None:
    extra = {"lora": {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["c_attn", "c_fc"]}} if finetune == "lora" else {"lora": None}
    outs = {}
    for on in (False, True):  # tiny-gpt2 has dropout 0.1 everywhere
        cfg = base_config(finetune=finetune, **extra, max_steps=6, log_every=1, eval_every=6, save_every=6,
                          memory={"gradient_checkpointing": on})
        outs[on] = tmp_path / f"gc-{on}"
        result = run(outs[on], cfg, assets, nproc=nproc)
        assert result.returncode == 0, result.stdout
        assert ("gradient checkpointing" in result.stdout) == on
    rows = {on: [m for m in metrics(out) if "loss" in m or "eval_loss" in m] for on, out in outs.items()}
    assert [r["step"] for r in rows[True]] == [r["step"] for r in rows[False]] == [1, 2, 3, 4, 5, 6, 6]
    for plain, checkpointed in zip(rows[False], rows[True]):
        for key in ("loss", "grad_norm", "eval_loss"):
            if key in plain:
                assert checkpointed[key] == pytest.approx(plain[key], rel=1e-6, abs=1e-7), key
    plain_w, checkpointed_w = _weights(outs[False]), _weights(outs[True])
    assert plain_w.keys() == checkpointed_w.keys() and plain_w
    for name, tensor in plain_w.items():
        torch.testing.assert_close(checkpointed_w[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def _saved_activation_bytes(assets: Path, monkeypatch: pytest.MonkeyPatch, on: bool) -> int:
    """Bytes autograd keeps between a forward and its backward, with the trainer's own model setup."""
    monkeypatch.chdir(assets)
    cfg = TrainConfig.model_validate(base_config(finetune="full", lora=None, memory={"gradient_checkpointing": on}))
    model, tokenizer = trainsetup.load_model(cfg, CPU_ONE, None)
    examples = data.load_examples("data/train.jsonl", "alpaca", tokenizer, 64)[:8]
    batch = data.collate(examples, tokenizer.pad_token_id)
    saved = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_sum(model, batch, torch.autocast("cpu", enabled=False))
    loss.backward()  # the graph works either way
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    return sum(saved)


def test_gradient_checkpointing_keeps_fewer_activations(assets: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _saved_activation_bytes(assets, monkeypatch, on=False)
    checkpointed = _saved_activation_bytes(assets, monkeypatch, on=True)
    assert checkpointed < 0.5 * plain, (checkpointed, plain)


def test_quantize_is_refused_on_cpu_before_anything_loads(assets: Path, tmp_path: Path) -> None:
    result = run(tmp_path, base_config(memory={"quantize": "4bit"}, max_steps=2), assets, nproc=None)
    assert result.returncode == 2, result.stdout
    errors = [line for line in result.stdout.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stdout
    assert "memory.quantize 4bit needs a CUDA GPU (bitsandbytes k-bit kernels); this process trains on cpu" in errors[0]
    if not quantize.has_bitsandbytes():
        assert "needs the bitsandbytes package, which is not installed" in errors[0]
    assert "finetune lora" not in result.stdout  # refused before the model was loaded
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize(("device", "package", "expected"), [
    ("cuda", True, []),
    ("cuda", False, ["needs the bitsandbytes package"]),
    ("cpu", True, ["needs a CUDA GPU"]),
    ("cpu", False, ["needs a CUDA GPU", "needs the bitsandbytes package"]),
    ("mps", True, ["needs a CUDA GPU"]),
])
def test_quantize_problems_name_every_missing_piece(device: str, package: bool, expected: list[str]) -> None:
    for bits in ("4bit", "8bit"):
        found = quantize.problems(bits, device, package)
        assert len(found) == len(expected) and all(e in f for e, f in zip(expected, found))
        assert all(f.startswith(f"memory.quantize {bits} needs") and "\n" not in f for f in found)
    assert quantize.problems(None, "cpu", False) == []  # nothing asked, nothing refused


def test_quantized_loading_is_the_qlora_recipe_on_the_ranks_gpu() -> None:
    kw = quantize.from_pretrained_kwargs("4bit", torch.bfloat16, torch.device("cuda", 3))
    q = kw["quantization_config"]
    assert q.load_in_4bit and not q.load_in_8bit
    assert (q.bnb_4bit_quant_type, q.bnb_4bit_use_double_quant, q.bnb_4bit_compute_dtype) == ("nf4", True, torch.bfloat16)
    assert kw["device_map"] == {"": 3} and kw["dtype"] == torch.bfloat16
    kw8 = quantize.from_pretrained_kwargs("8bit", None, torch.device("cuda", 0))
    assert kw8["quantization_config"].load_in_8bit and kw8["device_map"] == {"": 0} and kw8["dtype"] == torch.float32
    assert quantize.from_pretrained_kwargs(None, torch.bfloat16, torch.device("cuda", 0)) == {}


def test_merging_into_a_fresh_base_equals_merging_in_memory(assets: Path, tmp_path: Path) -> None:
    """The QLoRA export path (adapter merged into the base reloaded unquantized) on a plain LoRA run:
    the same merged weights as peft's in-memory merge that outputs/merged/ holds."""
    cfg = base_config(lora={"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["c_attn"]}, max_steps=4,
                      export={"merge_lora": True})
    result = run(tmp_path, cfg, assets, nproc=None)
    assert result.returncode == 0, result.stdout
    fresh = export.merge_into_fresh_base(tmp_path / "outputs", assets / "tiny-gpt2").state_dict()
    merged = load_file(tmp_path / "outputs" / "merged" / "model.safetensors")
    assert merged and set(merged) <= set(fresh)
    base = load_file(assets / "tiny-gpt2" / "model.safetensors")
    changed = [k for k in merged if "c_attn.weight" in k]
    assert changed and all(not torch.equal(merged[k], base[k]) for k in changed)  # the adapter is in there
    for name, tensor in merged.items():
        torch.testing.assert_close(fresh[name], tensor, rtol=0, atol=1e-6, msg=name)


def test_lora_under_autocast_keeps_its_frozen_base_in_half_precision(assets: Path, tmp_path: Path) -> None:
    """bf16 LoRA: the base is held in bf16 (half of fp32's memory), the adapter trains in fp32, and
    the merged export is made from the stored fp32 base, not the bf16 copy."""
    cfg = base_config(precision="bf16", max_steps=4, log_every=2, export={"merge_lora": True})
    result = run(tmp_path, cfg, assets, nproc=1)
    assert result.returncode == 0, result.stdout
    assert "frozen base in bfloat16" in result.stdout
    adapter = load_file(tmp_path / "outputs" / "adapter_model.safetensors")
    assert adapter and all(t.dtype == torch.float32 for t in adapter.values())
    merged = load_file(tmp_path / "outputs" / "merged" / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in merged.values())
    base = load_file(assets / "tiny-gpt2" / "model.safetensors")
    untouched = [k for k in merged if k in base and "c_attn" not in k]
    assert untouched and all(torch.equal(merged[k], base[k]) for k in untouched)  # never rounded through bf16
    fp32 = run(tmp_path / "fp32", base_config(precision="fp32", max_steps=1), assets, nproc=1)
    assert fp32.returncode == 0 and "frozen base in" not in fp32.stdout

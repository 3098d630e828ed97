"""Each fine-tuning mode trains under real torchrun (2 processes, gloo) and exports loadable weights."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tests.support.trainer import base_config, run, train_losses


def _state(path: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(path).state_dict()


def _no_wrapper_prefixes(keys: list[str]) -> bool:
    return not any(k.startswith(("module.", "_orig_mod.")) or ".module." in k for k in keys)


def test_lora_trains_an_adapter_and_leaves_base_weights_untouched(assets: Path, tmp_path: Path) -> None:
    cfg = base_config(max_steps=30, lr=5e-3, export={"merge_lora": True})
    result = run(tmp_path, cfg, assets, nproc=2)
    assert result.returncode == 0, result.stdout
    assert "4,096 of 153,344 parameters trainable" in result.stdout
    losses = train_losses(tmp_path)
    assert losses[-1] < losses[0]

    adapter = load_file(tmp_path / "outputs" / "adapter_model.safetensors")
    assert adapter and _no_wrapper_prefixes(list(adapter)) and all("lora_" in k for k in adapter)
    assert set(adapter) == set(load_file(tmp_path / "checkpoints" / "step-30" / "adapter_model.safetensors"))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-20", "step-30"]  # keep_checkpoints: 2
    base = AutoModelForCausalLM.from_pretrained(assets / "tiny-gpt2")
    original = {k: v.clone() for k, v in base.state_dict().items()}
    peft_model = PeftModel.from_pretrained(base, tmp_path / "outputs")
    base_state = {k.replace("base_layer.", ""): v for k, v in peft_model.get_base_model().state_dict().items() if "lora_" not in k}
    assert base_state.keys() == original.keys() and all(torch.equal(v, original[k]) for k, v in base_state.items())

    merged = _state(tmp_path / "outputs" / "merged")
    changed = {k for k, v in merged.items() if not torch.equal(v, original[k])}
    assert changed == {f"transformer.h.{i}.attn.c_attn.weight" for i in range(2)}


def test_full_finetune_trains_everything_and_exports_a_pruned_model(assets: Path, tmp_path: Path) -> None:
    cfg = base_config(finetune="full", lora=None, max_steps=20, lr=1e-3, export={"prune": {"amount": 0.3}})
    result = run(tmp_path, cfg, assets, nproc=2)
    assert result.returncode == 0, result.stdout
    losses = train_losses(tmp_path)
    assert losses[-1] < losses[0]
    ckpt = load_file(tmp_path / "checkpoints" / "step-20" / "model.safetensors")
    assert _no_wrapper_prefixes(list(ckpt)) and all(v.dtype == torch.float32 for v in ckpt.values())

    original, exported = _state(assets / "tiny-gpt2"), _state(tmp_path / "outputs")
    assert all(not torch.equal(exported[k], original[k]) for k in ("transformer.wte.weight", "transformer.h.0.mlp.c_fc.weight"))
    report = json.loads((tmp_path / "outputs" / "export.json").read_text())
    assert abs(report["sparsity"] - 0.3) < 0.01
    pruned = [v for k, v in exported.items() if k.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))]
    assert abs(sum(int((v == 0).sum()) for v in pruned) / sum(v.numel() for v in pruned) - 0.3) < 0.01


def test_partial_finetune_changes_only_the_named_modules_and_the_tied_embedding(assets: Path, tmp_path: Path) -> None:
    cfg = base_config(finetune="partial", lora=None, partial={"trainable": ["transformer.h.1", "lm_head"]},
                      data={"train": "data/text.jsonl", "format": "text", "max_length": 64}, max_steps=20, lr=1e-3)
    result = run(tmp_path, cfg, assets, nproc=2)
    assert result.returncode == 0, result.stdout
    losses = train_losses(tmp_path)
    assert losses[-1] < losses[0]
    original, trained = _state(assets / "tiny-gpt2"), _state(tmp_path / "outputs")
    changed = {k for k in original if not torch.equal(original[k], trained[k])}
    # lm_head.weight is transformer.wte.weight in GPT-2: naming lm_head trains the shared matrix.
    expected = {k for k in original if k.startswith("transformer.h.1.")} | {"transformer.wte.weight", "lm_head.weight"}
    assert changed == expected

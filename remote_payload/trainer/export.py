"""The final `outputs/` folder: trained weights and tokenizer in save_pretrained form.

    outputs/                     full / partial: the whole model; lora: the peft adapter
    outputs/merged/              lora with export.merge_lora: the base model with the adapter merged
    outputs/export.json          what was written, and the sparsity when export.prune is set

Contract: main rank only. The folder is built as `outputs.tmp/` and renamed into place, so
`outputs/` is either the previous complete export or the new complete one. Exporting may modify
the model in place (merging, pruning): call it last. When the frozen base is held below fp32
(`memory.quantize`, or LoRA's fp16/bf16 base) the adapter is merged into the base loaded afresh
in its stored dtype on the CPU (`merge_into_fresh_base`), never into the 4/8/16-bit copy, which
would round the merged model.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import torch
from torch.nn.utils import prune

from remote_payload.contract.train_config import TrainConfig

log = logging.getLogger(__name__)


def prunable_weights(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """(module, "weight") for every Linear / transformers Conv1D, except the output head
    (tied to the input embedding in GPT-2-like models)."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    return [(m, "weight") for m in model.modules() if isinstance(m, (torch.nn.Linear, Conv1D)) and m is not head]


def magnitude_prune(model: torch.nn.Module, amount: float) -> float:
    """Global L1 magnitude pruning of `prunable_weights`, made permanent; returns their sparsity."""
    targets = prunable_weights(model)
    prune.global_unstructured(targets, pruning_method=prune.L1Unstructured, amount=amount)
    for module, name in targets:
        prune.remove(module, name)
    zeros = sum(int((m.weight == 0).sum()) for m, _ in targets)
    total = sum(m.weight.numel() for m, _ in targets)
    return zeros / total


def merge_into_fresh_base(adapter_dir: Path, model_path: Path) -> torch.nn.Module:
    """The peft adapter saved in `adapter_dir` merged into the base at `model_path`, loaded unquantized
    in the dtype it is stored in, on the CPU (a 7B bf16 base needs ~14 GB of RAM)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_path, dtype="auto")
    return PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()


def _reduced_base(raw_model: torch.nn.Module) -> bool:
    """Whether the frozen (base) weights are held below fp32: 4/8-bit, or LoRA's fp16/bf16 base."""
    return any(p.dtype != torch.float32 for p in raw_model.parameters() if not p.requires_grad)


def export_outputs(raw_model: torch.nn.Module, tokenizer: object, cfg: TrainConfig, out: Path) -> dict[str, object]:
    """Write `out/outputs/` (see the module doc) and return the export report."""
    tmp, final = out / "outputs.tmp", out / "outputs"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    report: dict[str, object] = {"finetune": cfg.finetune}
    target, target_dir = raw_model, tmp
    if cfg.finetune == "lora":
        raw_model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        report["adapter"] = "."
        if cfg.export.merge_lora:
            if _reduced_base(raw_model):  # k-bit or half-precision frozen weights: merge at the stored precision
                from remote_payload.trainer.model import resolve_model_path

                target = merge_into_fresh_base(tmp, resolve_model_path(cfg.model))
            else:
                target = raw_model.merge_and_unload()
            target_dir = tmp / "merged"
            report["merged"] = "merged"
    if cfg.export.prune is not None:
        report["sparsity"] = magnitude_prune(target, cfg.export.prune.amount)
        report["prune_amount"] = cfg.export.prune.amount
        log.info("pruned %.1f%% of the Linear/Conv1D weights", 100 * report["sparsity"])
    if target_dir != tmp or cfg.finetune != "lora":
        target.save_pretrained(target_dir, safe_serialization=True)
        tokenizer.save_pretrained(target_dir)
    (tmp / "export.json").write_text(json.dumps(report, indent=1))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    log.info("wrote %s", final)
    return report

"""QLoRA: frozen base weights in 4-bit NF4 or 8-bit through bitsandbytes, and gradient checkpointing.

Contracts:
- `problems(quantize, device_type, has_bitsandbytes)`: every reason `memory.quantize` cannot run
  in this process, one line each (not a CUDA device; the package missing). The trainer refuses
  with all of them before loading anything (exit 2) and never falls back to unquantized
  weights: a job sized for 4-bit would run out of memory, or silently train something else.
- `from_pretrained_kwargs(quantize, compute_dtype, device)`: what `from_pretrained` needs to
  load the base quantized onto this rank's GPU. 4bit is NF4 with double quantization (the
  QLoRA recipe), computing in the run's autocast dtype (fp32 without one); 8bit is LLM.int8().
- `prepare(model, quantize, gradient_checkpointing)`: a loaded model made ready to train:
  k-bit models through peft's `prepare_model_for_kbit_training` (norms and head in fp32, input
  gradients for checkpointing); gradient checkpointing non-reentrant, which needs no input
  gradients, works under DDP and FSDP, and replays dropout's RNG (losses unchanged).

Schema-level rules (quantize needs LoRA and strategy ddp) live in contract/train_config.py and are checked on the
laptop by `orch check`. Only `from_pretrained_kwargs` and `prepare` import torch/transformers/peft.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

CHECKPOINTING = {"use_reentrant": False}


def has_bitsandbytes() -> bool:
    """Whether the bitsandbytes package is importable here (without importing it)."""
    return importlib.util.find_spec("bitsandbytes") is not None


def problems(quantize: str | None, device_type: str, bitsandbytes: bool) -> list[str]:
    """Why `memory.quantize: <quantize>` cannot run on `device_type` (empty: it can)."""
    if quantize is None:
        return []
    found = []
    if device_type != "cuda":
        found.append(f"memory.quantize {quantize} needs a CUDA GPU (bitsandbytes k-bit kernels); this process "
                     f"trains on {device_type}: remove memory.quantize to train unquantized")
    if not bitsandbytes:
        found.append(f"memory.quantize {quantize} needs the bitsandbytes package, which is not installed: add it to "
                     "the job's setup (pip install bitsandbytes) or remove memory.quantize")
    return found


def from_pretrained_kwargs(quantize: str | None, compute_dtype: torch.dtype | None, device: torch.device) -> dict:
    """`from_pretrained` keyword arguments that load the base quantized on `device` (empty: not quantized).
    Unquantized modules (norms, embeddings, head) load in the compute dtype; `prepare` lifts them to fp32."""
    if quantize is None:
        return {}
    import torch
    from transformers import BitsAndBytesConfig

    dtype = compute_dtype or torch.float32
    if quantize == "4bit":
        config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                    bnb_4bit_compute_dtype=dtype, bnb_4bit_quant_storage=torch.uint8)
    else:
        config = BitsAndBytesConfig(load_in_8bit=True)
    return {"quantization_config": config, "dtype": dtype, "device_map": {"": device.index or 0}}


def prepare(model: torch.nn.Module, quantize: str | None, gradient_checkpointing: bool) -> torch.nn.Module:
    """Ready a freshly loaded (not yet LoRA-wrapped) model for training; see the module contract."""
    if quantize is not None:
        from peft import prepare_model_for_kbit_training

        return prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing,
                                               gradient_checkpointing_kwargs=CHECKPOINTING)
    if gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2 (the old name is deprecated)
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=CHECKPOINTING)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=CHECKPOINTING)
    return model

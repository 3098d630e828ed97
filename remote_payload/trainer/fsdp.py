"""`train.strategy: fsdp`: shard the model with torch's FSDP2 (`fully_shard`) and move full state
dicts in and out of it.

Why FSDP2 and not `FullyShardedDataParallel` (FSDP1): `fully_shard` shards every parameter on
its own (a DTensor on dim 0), so LoRA's mixed `requires_grad` needs no `use_orig_params`, the
module keeps its class and parameter names (no `_fsdp_wrapped_module.` prefixes to strip), and
the same code runs on CPU with gloo (the tests) and on CUDA with nccl. FSDP1 is deprecated in
torch 2.13. Gradients and AdamW state are sharded with the parameters (the optimizer is built
over the DTensor parameters, so its state is DTensors too).

Contracts:
- `shard` is called after `apply_finetune` and after the checkpoint's weights are loaded (so
  `requires_grad` is final and every rank starts from the same weights); it shards in place and
  returns the same module, which trains, evaluates and is called exactly like the unwrapped one.
- Every function that takes the sharded model is a collective: every rank calls it, in the same
  order (`full_state_dicts`, `OptimizerIO.load_state_dict`; and every forward/backward, see
  `eval_lockstep`).
- Checkpoints hold full (unsharded) state dicts written by rank 0 in the same layout as DDP's:
  parameter names are the unwrapped module's, so `checkpoint.load_weights` and
  `from_pretrained` read them unchanged. The optimizer state in `trainer_state.pt` is keyed by
  parameter name (torch.distributed.checkpoint's full form), not by index as under DDP.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from remote_payload.contract.train_config import TrainConfig
from remote_payload.trainer import checkpoint
from remote_payload.trainer import model as modeling

log = logging.getLogger(__name__)
_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def _block_classes(model: torch.nn.Module) -> set[str]:
    """Class names of the transformer blocks: Hugging Face's `_no_split_modules` (of the base
    model under peft)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return set(getattr(base, "_no_split_modules", None) or [])


def shard(model: torch.nn.Module, device: torch.device, amp_dtype: torch.dtype | None) -> torch.nn.Module:
    """`fully_shard` every transformer block, then the root (embeddings, tied head, final norm).

    On CUDA with bf16/fp16, parameters are all-gathered in that dtype and gradients reduced in
    fp32 (`MixedPrecisionPolicy`); the sharded master weights and AdamW state stay fp32, and the
    trainer's autocast still decides per-op precision, as under DDP. On CPU nothing is cast.
    `amp_dtype` is never fp16: precision.py refuses fsdp with fp16 before the model is loaded.
    """
    mp = MixedPrecisionPolicy(param_dtype=amp_dtype, reduce_dtype=torch.float32) if amp_dtype and device.type == "cuda" \
        else MixedPrecisionPolicy()
    classes = _block_classes(model)
    blocks = [m for m in model.modules() if type(m).__name__ in classes]
    for block in blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    log.info("fsdp: sharded %d %s blocks and the root over %d processes", len(blocks),
             "/".join(sorted(classes)) or "(no known)", torch.distributed.get_world_size())
    return model


@contextlib.contextmanager
def no_sync(model: torch.nn.Module) -> Iterator[None]:
    """Accumulate gradients locally (no reduce-scatter) for the micro-steps inside; FSDP2's
    `set_requires_gradient_sync`, the counterpart of DDP's `no_sync()`."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective for a sharded one); a plain tensor unchanged.
    `clip_grad_norm_` over DTensor gradients returns the global norm as a replicated DTensor."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def full_state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(model, optimizer) full state dicts on the CPU of rank 0; empty dicts on the other ranks.
    Collective. The model's keys are the unwrapped module's `state_dict()` keys, less tied
    duplicates (GPT-2's `lm_head.weight`), which `save_pretrained` would otherwise write twice."""
    state = get_model_state_dict(model, options=_FULL)
    unique = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    return {k: v for k, v in state.items() if k in unique}, get_optimizer_state_dict(model, optimizer, options=_FULL)


class OptimizerIO:
    """The optimizer as `checkpoint.load_training_state` sees it: `load_state_dict` takes the full
    (name-keyed) state from `full_state_dicts` and keeps this rank's shard. Collective."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def load_state_dict(self, state: dict) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state, options=StateDictOptions(full_state_dict=True))


def eval_lockstep(batches: list, filler: object, n_examples: int, world_size: int, batch_size: int) -> Iterator[tuple[object, bool]]:
    """(batch, counts) pairs, the same number on every rank: a sharded forward is a collective, so
    a rank with fewer eval batches than the busiest one runs `filler` (counts=False: its loss is
    not added) until they match."""
    per_rank = -(-n_examples // world_size)
    for i in range(-(-per_rank // batch_size)):
        yield (batches[i], True) if i < len(batches) else (filler, False)


def unsharded_copy(cfg: TrainConfig, ckpt: Path) -> tuple[torch.nn.Module, object]:
    """A fresh, unsharded CPU model with `ckpt`'s weights and its tokenizer, for export on rank 0
    (export merges and prunes modules in place, which a sharded model cannot do)."""
    base, tokenizer = modeling.load_model_and_tokenizer(modeling.resolve_model_path(cfg.model))
    model = modeling.apply_finetune(base, cfg)
    checkpoint.load_weights(model, ckpt, cfg.finetune)
    return model, tokenizer

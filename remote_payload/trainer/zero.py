"""`train.strategy: deepspeed`: DeepSpeed ZeRO 1/2/3 (optional CPU offload) through Accelerate's
DeepSpeed plugin, fitted to the trainer's loop, checkpoints and export.

    config = zero.config_for(cfg, run_precision, info)         # contract/zeroconfig.py's rules
    optimizer = zero.make_optimizer(params, cfg, config)       # AdamW, or DeepSpeedCPUAdam when offloaded
    engine = zero.prepare(config, raw_model, optimizer)        # Accelerator(deepspeed_plugin=...).prepare
    losses = zero.accumulate(engine, micro, loss_of, scale)    # a step's micro-batches: backward, step
    norm, stepped = zero.stepped(engine)

Contracts:
- The DeepSpeed config is built whole by `config_for` (batch, accumulation, clipping and fp16/bf16
  from `train:`, nothing left "auto"); the plugin gets the accumulation up front, so Accelerate and
  DeepSpeed agree on the boundary.
- Precision is DeepSpeed's own mixed precision, not torch autocast: under fp16/bf16 the module is
  held in 16 bits, the optimizer keeps fp32 master weights, fp16 runs DeepSpeed's dynamic loss
  scaler (the trainer's GradScaler is off). fp32 runs everything in fp32.
- The step computes the same gradient as DDP's: the loss of each micro-batch is weighted by
  `world_size / (the step's label tokens over all ranks)`, known before the backward (DeepSpeed
  averages over ranks and is told not to divide by the accumulation: `scale_wrt_gas=False`), so
  DeepSpeed's clipping (`gradient_clipping` = max_grad_norm) sees the true gradient's norm.
  The trainer's lr schedule (a LambdaLR on the optimizer's param groups, which DeepSpeed's ZeRO
  optimizer shares) steps only when DeepSpeed applied the step (an fp16 overflow skips it).
- Every function taking the engine is a collective: every rank calls it, in the same order.
  `full_state_dict` consolidates the fp32 (master) weights on rank 0 under the unwrapped model's
  own names — ZeRO-3 shards gathered, no `module.` prefix — which `checkpoint.save_checkpoint`
  writes as the usual `model.safetensors` / adapter; `save_shards` writes DeepSpeed's own sharded
  state (every rank its optimizer partition) into the checkpoint folder's `deepspeed/` before the
  COMPLETE marker; `load_shards` restores it. Each rank writes and reads its own partition, so the
  checkpoint folder must be one all ranks share (one node, or a shared disk).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable
from pathlib import Path

import torch

from remote_payload.contract import zeroconfig
from remote_payload.contract.train_config import TrainConfig, TrainSetupError
from remote_payload.trainer.distributed import DistInfo

log = logging.getLogger(__name__)
FOLDER, TAG = "deepspeed", "state"  # <checkpoint>/deepspeed/state/: DeepSpeed's save_checkpoint layout
OPTIM_SHARD = re.compile(r"^(zero_pp_rank_\d+_)?mp_rank_\d+_optim_states\.pt$")
MIXED = {"fp32": "no", "fp16": "fp16", "bf16": "bf16"}  # Accelerate's mixed_precision for a resolved precision


def config_for(cfg: TrainConfig, run_precision: str, info: DistInfo) -> dict:
    """The whole DeepSpeed config of this run (see zeroconfig.build), or `TrainSetupError` naming
    the file (and line) or `train.deepspeed`."""
    section = cfg.deepspeed
    assert section is not None
    if not info.enabled:  # DeepSpeed would look for MPI to find its world (mpi4py), and fail or hang
        raise TrainSetupError("strategy: deepspeed needs torchrun's process group (orch starts the built-in trainer "
                              "under torchrun); started as a plain process, run it with torchrun --nproc_per_node 1")
    job = zeroconfig.JobValues(cfg.batch_size, cfg.grad_accum, cfg.max_grad_norm, run_precision, info.world_size)
    where, text = "train.deepspeed", ""
    if section.config is None:
        config = zeroconfig.from_section(zeroconfig.Zero(section.zero_stage, section.offload_optimizer, section.offload_params))
    else:
        where = f"deepspeed.config {section.config}"
        try:
            text = Path(section.config).read_text()
        except OSError as exc:
            raise TrainSetupError(f"{where}: cannot read it ({exc.strerror or exc}; relative paths resolve against "
                                  f"{Path.cwd()})") from None
        config, found = zeroconfig.read_json(text)
        if config is None:
            raise TrainSetupError(f"{where}: {found[0].text()}")
    try:
        return zeroconfig.build(config, job, text)
    except zeroconfig.ZeroConfigError as exc:
        raise TrainSetupError(f"{where}: {exc}") from None


def describe(config: dict) -> str:
    z = zeroconfig.zero_of(config)
    offload = [name for name, on in (("optimizer", z.offload_optimizer), ("parameters", z.offload_params)) if on]
    return f"ZeRO stage {z.stage}" + (f", {' and '.join(offload)} offloaded to CPU memory" if offload else "")


def make_optimizer(params: list[torch.nn.Parameter], cfg: TrainConfig, config: dict) -> torch.optim.Optimizer:
    """AdamW over `params` with the job's lr and weight decay: DeepSpeed's CPU Adam (AdamW mode)
    when the optimizer is offloaded (DeepSpeed steps it on the CPU: torch's would be refused),
    torch's otherwise."""
    if zeroconfig.zero_of(config).offload_optimizer:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, adamw_mode=True)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def prepare(config: dict, raw_model: torch.nn.Module, optimizer: torch.optim.Optimizer, run_precision: str) -> torch.nn.Module:
    """The DeepSpeed engine around `raw_model` and `optimizer`, made by Accelerate's DeepSpeed plugin
    (the process group is torchrun's, already set up). Collective."""
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin

    steps = config["gradient_accumulation_steps"]
    plugin = DeepSpeedPlugin(hf_ds_config=config, gradient_accumulation_steps=steps)
    accelerator = Accelerator(deepspeed_plugin=plugin, mixed_precision=MIXED[run_precision], gradient_accumulation_steps=steps)
    engine, _ = accelerator.prepare(raw_model, optimizer)
    # The plugin told transformers that ZeRO-3 is on, so any later from_pretrained (rank 0's export
    # copy) would build its model under zero.Init, a collective only rank 0 enters: a hang.
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    log.info("deepspeed: %s, %s", describe(config), {"fp32": "fp32", "fp16": "fp16 with dynamic loss scaling",
                                                       "bf16": "bf16 with fp32 master weights"}[run_precision])
    return engine


def accumulate(engine: torch.nn.Module, micro: list, loss_of: Callable[[object], torch.Tensor], scale: float) -> torch.Tensor:
    """Forward and backward each micro-batch through the engine (`loss_of(batch)`: its summed loss),
    the last one at the accumulation boundary, then DeepSpeed's step (reduce, clip, optimizer step,
    zero grads). Returns the summed loss of the micro-batches (detached)."""
    total = torch.zeros((), dtype=torch.float32, device=engine.device)
    for i, batch in enumerate(micro):
        engine.set_gradient_accumulation_boundary(is_boundary=i == len(micro) - 1)
        loss = loss_of(batch)
        engine.backward(loss * scale, scale_wrt_gas=False)
        total += loss.detach()
    engine.step()
    return total


def stepped(engine: torch.nn.Module) -> tuple[torch.Tensor, bool]:
    """(the global gradient norm before clipping, whether the step was applied: False after an fp16
    overflow) of the engine's last step."""
    norm = engine.get_global_grad_norm()
    value = float(norm) if norm is not None else float("nan")
    return torch.tensor(value), bool(engine.was_step_applied())


def loss_scale(engine: torch.nn.Module) -> float | None:
    """DeepSpeed's current fp16 loss scale (None when it does not scale)."""
    if not engine.fp16_enabled():
        return None
    scale = getattr(engine.optimizer, "loss_scale", None)
    return float(scale) if scale is not None else None


def full_state_dict(engine: torch.nn.Module, raw_model: torch.nn.Module, trainable_only: bool, is_main: bool) -> dict:
    """The unwrapped model's weights in fp32 on rank 0's CPU ({} elsewhere), keyed as its own
    `state_dict()` less tied duplicates (as fsdp.full_state_dicts): trained parameters from the
    optimizer's fp32 master copy (ZeRO partitions gathered), frozen ones gathered from the module
    (`trainable_only`: LoRA, whose checkpoint is the adapter alone). Collective."""
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param

    stage3 = engine.zero_optimization_partition_weights()
    state: dict[str, torch.Tensor] = {}
    for name, param in raw_model.named_parameters():
        if param.requires_grad:
            full = safe_get_full_fp32_param(param)
        elif trainable_only:
            continue
        else:
            with deepspeed.zero.GatheredParameters([param], enabled=stage3):
                full = param.data.clone()
        if is_main:
            state[name] = full.detach().float().cpu().clone()
    if not trainable_only and is_main:
        for module_name, module in raw_model.named_modules():
            for name, buf in module.named_buffers(recurse=False):
                if buf is not None and name not in module._non_persistent_buffers_set:
                    key = f"{module_name}.{name}" if module_name else name
                    state[key] = (buf.float() if buf.is_floating_point() else buf).detach().cpu().clone()
    return state


def save_shards(engine: torch.nn.Module, folder: Path) -> None:
    """DeepSpeed's own sharded state (every rank's optimizer partition, its counters and loss
    scaler) into `folder/deepspeed/`; frozen weights left out (the checkpoint holds the model).
    Collective."""
    engine.save_checkpoint(str(folder / FOLDER), tag=TAG, save_latest=False, exclude_frozen_parameters=True)


def load_shards(engine: torch.nn.Module, ckpt: Path, info: DistInfo) -> bool:
    """Restore DeepSpeed's sharded state from checkpoint `ckpt` (collective). Its partitions fit
    only the world size that wrote them: with another number of processes (or shards missing) the
    weights come from the checkpoint's model files alone and the optimizer state starts afresh,
    said in the log. Returns whether the optimizer state was restored."""
    folder = ckpt / FOLDER / TAG
    shards = sorted(p.name for p in folder.glob("*optim_states.pt")) if folder.is_dir() else []
    if len(shards) != info.world_size:
        log.warning("%s holds DeepSpeed optimizer partitions for %d processes, this run has %d: resuming the weights, "
                    "schedule and data position; the AdamW moments start afresh", ckpt.name, len(shards), info.world_size)
        return False
    _, client = engine.load_checkpoint(str(ckpt / FOLDER), tag=TAG, load_module_strict=False, load_optimizer_states=True,
                                       load_lr_scheduler_states=False)
    return client is not None


class NoOptimizerIO:
    """What `checkpoint.load_training_state` loads the optimizer through under DeepSpeed: nothing
    (the optimizer state is DeepSpeed's, restored by `load_shards`)."""

    def load_state_dict(self, state: object) -> None:
        return None


def autocast() -> contextlib.AbstractContextManager:
    """No torch autocast under DeepSpeed (its own 16-bit module, see the contract)."""
    return contextlib.nullcontext()

"""Setup of a training run: everything the loop in loop.py needs, built in a fixed order.

    run = setup(cfg, out, info)   # seed → precision → model → head → data → resume point → wrap → optimizer

Contracts:
- Every rank builds the same `Run` from the same config; nothing here trains. A configuration,
  data or model problem found here is a `TrainSetupError` (one line, exit 2).
- `Run.model` is what forward and backward go through (DDP, FSDP, the DeepSpeed engine or the model itself);
  `Run.raw_model` is the unwrapped (peft) model that checkpoints, evaluation and export use.
- `Run.progress` is where training stands: the checkpoint's when resuming, else step 0; the loop
  replaces it after each step (`checkpoint.Progress` is immutable).
- requires_grad is final before the DDP/FSDP wrap; the optimizer holds exactly the trainable
  parameters (`Run.params`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from remote_payload.contract import precision as rules
from remote_payload.contract.train_config import TrainConfig, TrainSetupError
from remote_payload.trainer import (checkpoint, data, distributed, fanout, fsdp, host, mixture, neftune, precision, quantize,
                                    transform)
from remote_payload.trainer import model as modeling
from remote_payload.trainer import zero

log = logging.getLogger("remote_payload.train")


@dataclass
class Run:
    """One process's view of the run (see the module contract)."""

    cfg: TrainConfig
    out: Path
    info: distributed.DistInfo
    model: torch.nn.Module
    raw_model: torch.nn.Module
    tokenizer: object
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    autocast: Callable[[], contextlib.AbstractContextManager]
    amp_dtype: torch.dtype | None
    packing: str | None  # model.packing_mode, None without packing
    head: torch.nn.Module | None  # the output head narrowed to labelled positions (logits: labels), None: full logits
    units: list  # what a batch is made of: examples, or packed rows
    eval_set: list[data.Example] | None
    steps_per_epoch: int
    total_steps: int
    sharded: bool  # FSDP across processes, or ZeRO-3: every forward is a collective
    no_sync: Callable[[], contextlib.AbstractContextManager]
    progress: checkpoint.Progress
    resumed: bool
    n_trainable: int
    n_total: int
    engine: torch.nn.Module | None = None  # strategy: deepspeed: the DeepSpeed engine (also `model`), zero.py
    mixed: mixture.Drawn | None = None  # data.mix: each source's examples and how many were drawn


def lr_factor(step: int, *, warmup: int, total: int, schedule: str) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based): linear warm-up, then decay towards 0,
    which only `step == total`, one past the last step, reaches (the last step keeps a small lr)."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress


def seed_everything(seed: int) -> None:
    """The same seed on every rank: new modules (LoRA) start identical everywhere."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def frozen_base_dtype(cfg: TrainConfig, amp_dtype: torch.dtype | None) -> bool:
    """Whether LoRA's frozen base is held in the autocast dtype (half the memory of fp32; the forward
    computes in that dtype anyway) rather than fp32. The adapter stays fp32 (peft upcasts it).
    Only under DDP: FSDP shards units whose parameters share one dtype."""
    return cfg.finetune == "lora" and amp_dtype is not None and cfg.strategy == "ddp" and not cfg.memory.quantize


def load_model(cfg: TrainConfig, info: distributed.DistInfo, amp_dtype: torch.dtype | None) -> tuple[torch.nn.Module, object]:
    """The unwrapped trainable model on this rank's device (quantized, checkpointed, LoRA-wrapped as
    configured) and its tokenizer. `memory.quantize` that cannot run here is refused first."""
    mem = cfg.memory
    refused = quantize.problems(mem.quantize, info.device.type, quantize.has_bitsandbytes())
    if refused:
        raise TrainSetupError("; ".join(refused))
    load_kwargs = quantize.from_pretrained_kwargs(mem.quantize, amp_dtype, info.device)
    if not load_kwargs and frozen_base_dtype(cfg, amp_dtype):
        load_kwargs = {"dtype": amp_dtype}
    prefer_flash = cfg.data.packing and info.device.type == "cuda" and amp_dtype is not None
    base, tokenizer = modeling.load_model_and_tokenizer(modeling.resolve_model_path(cfg.model), prefer_flash, load_kwargs)
    base = quantize.prepare(base, mem.quantize, mem.gradient_checkpointing)
    if cfg.activations == "fused" and (fused := modeling.fuse_activations(base)):
        log.info("activations: %d tanh-GELU modules run as torch's fused kernel", fused)
    raw_model = modeling.apply_finetune(base, cfg)
    if mem.quantize is None and cfg.strategy != "deepspeed":  # DeepSpeed places (ZeRO-3: partitions) it itself
        raw_model = raw_model.to(info.device)  # a k-bit base is already on its GPU and cannot move
    raw_model.train()  # from_pretrained returns eval mode: dropout would be off until the first eval
    return raw_model, tokenizer


def load_data(cfg: TrainConfig, info: distributed.DistInfo, tokenizer: object,
              raw_model: torch.nn.Module) -> tuple[list, list[data.Example] | None, str | None, int, mixture.Drawn | None]:
    """(units, eval examples, packing mode, optimizer steps per epoch, what data.mix drew)."""
    d = cfg.data
    fn = transform.load(d.transform)
    if d.mix is None:
        train_set = data.load_examples(d.train, d.format, tokenizer, d.max_length, d.sample, cfg.seed, fn)
        eval_set = data.load_examples(d.eval, d.format, tokenizer, d.max_length) if d.eval else None
        mixed = None
    else:
        train_set, eval_set, mixed = load_mixture(cfg, tokenizer, fn)
    packing = modeling.packing_mode(raw_model) if d.packing else None  # how packed rows keep examples apart
    units = data.pack(train_set, d.max_length, cfg.seed) if packing else train_set
    if packing:
        log.info("packing %d examples into %d rows of up to %d tokens (%.1f%% filled; %s)", len(train_set), len(units),
                 d.max_length, 100 * sum(map(len, units)) / (len(units) * d.max_length), packing)
    steps_per_epoch = data.batches_per_epoch(len(units), info.world_size, cfg.batch_size) // cfg.grad_accum
    if steps_per_epoch == 0:
        raise TrainSetupError(f"{d.train or 'data.mix'}: {len(units)} {'packed rows' if d.packing else 'examples'} are fewer than one step "
                              f"(batch_size {cfg.batch_size} x grad_accum {cfg.grad_accum} x {info.world_size} processes)")
    return units, eval_set, packing, steps_per_epoch, mixed


def load_mixture(cfg: TrainConfig, tokenizer: object, fn: transform.Transform | None,
                 ) -> tuple[list[data.Example], list[data.Example] | None, mixture.Drawn]:
    """`data.mix`: each source read (and transformed) on its own, drawn by `mixture.counts`/`draw`;
    the eval set is every source's eval file, whole. Logs what each source gives."""
    d = cfg.data
    assert d.mix is not None
    sources = [data.load_examples(m.train, m.format, tokenizer, d.max_length, None, cfg.seed, fn, i)
               for i, m in enumerate(d.mix)]
    sizes = [len(s) for s in sources]
    wanted = mixture.check_sizes(d.mix, sizes, d.mix_strategy)
    drawn = mixture.draw(sources, wanted, cfg.seed)
    log.info("data.mix (%s): %s", d.mix_strategy, "; ".join(
        f"{m.train} {n} of {size} ({100 * n / len(drawn):.1f}%, weight {m.weight:g})"
        for m, n, size in zip(d.mix, wanted, sizes)))
    evals = [e for i, m in enumerate(d.mix) if m.eval
             for e in data.load_examples(m.eval, m.format, tokenizer, d.max_length, source=i)]
    return drawn, evals or None, mixture.Drawn(tuple(sizes), tuple(wanted))


def output_head(cfg: TrainConfig, raw_model: torch.nn.Module, info: distributed.DistInfo,
                autocast: Callable[[], contextlib.AbstractContextManager]) -> torch.nn.Module | None:
    """`logits: labels`: the model's output head when narrowing it to labelled positions gives the
    model's own logits (`modeling.label_head`), else None (full logits), said once in the log."""
    if cfg.logits == "all":
        return None
    head, why_not = modeling.label_head(raw_model, next(raw_model.parameters()).device, autocast())
    if head is None:
        log.warning("logits: labels does not fit this model (%s); computing logits at every position", why_not)
    return head


def agreed_checkpoint(out: Path, info: distributed.DistInfo) -> Path | None:
    """The newest complete checkpoint of any rank, made complete on every rank's filesystem first
    (only rank 0 writes them, on its node: `fanout.share_latest` fans it out); None: start fresh.
    Raises `TrainSetupError` if a transfer fails, or if ranks still see different latest checkpoints."""
    ckpt = fanout.share_latest(out, info)
    latest = checkpoint.latest_checkpoint(out)
    seen = {str(c) for c in distributed.all_gather_object(info, latest and latest.name)}
    if seen != {str(ckpt and ckpt.name)}:  # the same decision on every rank
        raise TrainSetupError(f"ranks see different latest checkpoints {sorted(seen)} after sharing "
                              f"{ckpt and ckpt.name}: did a job folder change during the start?")
    return ckpt


def wrap(cfg: TrainConfig, info: distributed.DistInfo, raw_model: torch.nn.Module,
         amp_dtype: torch.dtype | None) -> tuple[torch.nn.Module, bool, Callable[[], contextlib.AbstractContextManager]]:
    """(the model forward/backward go through, sharded?, the no-gradient-sync context for micro-steps).
    DeepSpeed wraps later, with the optimizer (`zero.prepare`)."""
    if cfg.strategy == "deepspeed":
        return raw_model, False, contextlib.nullcontext
    sharded = cfg.strategy == "fsdp" and info.enabled  # FSDP shards in place: raw_model is model
    if cfg.strategy == "fsdp" and not sharded:
        log.info("strategy fsdp without torchrun: one process, nothing to shard; training unsharded")
    if sharded:
        model = fsdp.shard(raw_model, info.device, amp_dtype)
        return model, True, functools.partial(fsdp.no_sync, model)
    if info.world_size > 1:
        model = DistributedDataParallel(raw_model, device_ids=[info.local_rank] if info.device.type == "cuda" else None,
                                        find_unused_parameters=False, gradient_as_bucket_view=True)
        return model, False, model.no_sync
    return raw_model, False, contextlib.nullcontext


def settle_buckets(model: torch.nn.Module, device: torch.device,
                   autocast: Callable[[], contextlib.AbstractContextManager]) -> None:
    """Collective, DDP only: one throwaway forward and backward (two tokens, gradients dropped), so
    that a resumed run's first step already uses the gradient buckets DDP rebuilds after its first
    backward (in the order gradients become ready), as the uninterrupted run's steps after its first
    did. Without it the resumed run's first step all-reduces one bucket in parameter order, a
    different summation order for 3+ processes, and the run is no longer bit-identical.
    Call it before restoring the RNG: dropout consumes random numbers here."""
    with autocast():
        logits = model(input_ids=torch.zeros((1, 2), dtype=torch.long, device=device), use_cache=False).logits
    logits.float().sum().backward()
    for p in model.parameters():
        p.grad = None


def setup(cfg: TrainConfig, out: Path, info: distributed.DistInfo) -> Run:
    """Build the run (see the module contract); resumes from the latest complete checkpoint in `out`."""
    seed_everything(cfg.seed)
    run_precision = precision.on_device(cfg.precision, cfg.strategy, info.device)  # the rules: contract/precision.py
    amp_dtype = precision.autocast_dtype(run_precision)
    ds_config = zero.config_for(cfg, run_precision, info) if cfg.strategy == "deepspeed" else None  # refused before loading
    kept = info.device.type == "cpu" and host.keep_freed_memory()  # page faults every step otherwise
    log.info("device %s, world size %d, precision %s (%s), %s%s", info.device, info.world_size, cfg.precision,
             amp_dtype or torch.float32, modeling.hub_env_summary(), ", freed memory kept for reuse" * kept)
    raw_model, tokenizer = load_model(cfg, info, amp_dtype)
    n_trainable, n_total = modeling.count_parameters(raw_model)
    base = cfg.memory.quantize or (str(amp_dtype).removeprefix("torch.") if frozen_base_dtype(cfg, amp_dtype) else None)
    memory = [f"frozen base in {base}"] * bool(base) + ["gradient checkpointing"] * cfg.memory.gradient_checkpointing
    log.info("finetune %s: %s of %s parameters trainable (%.2f%%)%s", cfg.finetune, f"{n_trainable:,}", f"{n_total:,}",
             100 * n_trainable / n_total, "".join(f", {m}" for m in memory))
    autocast = (functools.partial(torch.autocast, info.device.type, dtype=amp_dtype) if amp_dtype and ds_config is None
                else contextlib.nullcontext)  # DeepSpeed runs its own 16-bit module (zero.py)
    head = output_head(cfg, raw_model, info, autocast)
    if cfg.data.neftune_alpha is not None:  # after output_head's check: the hook adds noise in training mode only
        neftune.activate(raw_model, cfg.data.neftune_alpha)
        log.info("NEFTune: noise alpha %g on the input embeddings in training forwards", cfg.data.neftune_alpha)
    units, eval_set, packing, steps_per_epoch, mixed = load_data(cfg, info, tokenizer, raw_model)
    total_steps = cfg.max_steps or cfg.epochs * steps_per_epoch
    ckpt = agreed_checkpoint(out, info)
    if ckpt is not None:
        checkpoint.load_weights(raw_model, ckpt, cfg.finetune)

    model, sharded, no_sync = wrap(cfg, info, raw_model, amp_dtype)
    if ckpt is not None and isinstance(model, DistributedDataParallel):
        settle_buckets(model, info.device, autocast)
    params = [p for p in raw_model.parameters() if p.requires_grad]
    optimizer = zero.make_optimizer(params, cfg, ds_config) if ds_config is not None else \
        torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=info.device.type in ("cuda", "cpu"))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, functools.partial(lr_factor, warmup=cfg.warmup_steps, total=total_steps, schedule=cfg.schedule))
    scaler = torch.amp.GradScaler(info.device.type, enabled=rules.uses_grad_scaler(run_precision) and ds_config is None)
    engine = None
    if ds_config is not None:
        model = engine = zero.prepare(ds_config, raw_model, optimizer, run_precision)
        sharded = bool(engine.zero_optimization_partition_weights())  # ZeRO-3: every forward is a collective
        if ckpt is not None:
            zero.load_shards(engine, ckpt, info)
    progress = checkpoint.Progress(world_size=info.world_size, mix_seen=(0,) * len(cfg.data.mix or ()))
    if ckpt is not None:
        io = zero.NoOptimizerIO() if engine is not None else fsdp.OptimizerIO(model, optimizer) if sharded else optimizer
        progress = checkpoint.load_training_state(info, ckpt, io, scheduler, scaler)
        if len(progress.mix_seen) != len(cfg.data.mix or ()):  # a checkpoint from before data.mix counted
            progress = dataclasses.replace(progress, mix_seen=(0,) * len(cfg.data.mix or ()))
        log.info("resuming from %s: step %d of %d (epoch %d)", ckpt, progress.step, total_steps, progress.epoch)
    return Run(cfg=cfg, out=out, info=info, model=model, raw_model=raw_model, tokenizer=tokenizer, params=params,
               optimizer=optimizer, scheduler=scheduler, scaler=scaler, autocast=autocast, amp_dtype=amp_dtype,
               packing=packing, head=head, units=units, eval_set=eval_set, steps_per_epoch=steps_per_epoch, total_steps=total_steps,
               sharded=sharded, no_sync=no_sync, engine=engine, progress=progress, resumed=ckpt is not None, n_trainable=n_trainable,
               n_total=n_total, mixed=mixed)

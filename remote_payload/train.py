"""The built-in trainer: fine-tune a Hugging Face causal LM (full / partial / LoRA) under torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node N \\
        -m remote_payload.train --config JOB_DIR/train.json --out JOB_DIR

Reads a `TrainConfig` (JSON), writes under `--out`: `metrics.jsonl` (rank 0),
`checkpoints/step-<N>/` and `outputs/`. Resumes from the latest complete checkpoint in `--out`
when there is one. Exit codes: 0 done; 2 a configuration/data/model problem found before
training (one-line message in the log); 128+signal (143 for SIGTERM) when stopped by a signal
after writing a checkpoint; anything else is a crash with a traceback.

Read top to bottom: setup (device, precision, model, data, resume) → DDP or FSDP (fsdp.py) → loop →
save/export.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import math
import os
import random
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

from remote_payload import checkpoint, data, distributed, export, fsdp, metrics, precision
from remote_payload import model as modeling
from remote_payload.config import TrainConfig, TrainSetupError
from remote_payload.data import IGNORE

log = logging.getLogger("remote_payload.train")


def lr_factor(step: int, *, warmup: int, total: int, schedule: str) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based): linear warm-up, then decay towards 0,
    which only `step == total`, one past the last step, reaches (the last step keeps a small lr)."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress


def optimizer_step(
    params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler, max_grad_norm: float | None,
) -> tuple[torch.Tensor, bool]:
    """unscale → clip → step → update → zero_grad. The scheduler steps only when the optimizer
    did (a GradScaler skips steps whose gradients hold inf/nan). Returns (grad norm, stepped)."""
    scaler.unscale_(optimizer)
    grads = [p.grad for p in params if p.grad is not None]
    if max_grad_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)  # DTensor-aware: global norm under FSDP
    else:
        norm = torch.nn.utils.get_total_norm(grads)
    norm = fsdp.full_tensor(norm)
    stepped = True
    if scaler.is_enabled():
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        stepped = scaler.get_scale() >= scale  # the scale only shrinks after a skipped step
    else:
        optimizer.step()
    if stepped:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, stepped


def loss_sum(model: torch.nn.Module, batch: data.Batch, autocast: contextlib.AbstractContextManager,
             packing: str | None = None) -> torch.Tensor:
    """Summed (not averaged) next-token cross-entropy over the batch's label tokens, in fp32.

    Unpacked batches pass no attention mask: they are right-padded and attention is causal, so
    padding never influences a real token (and pads are never targets), and SDPA takes its
    `is_causal` (flash) path. Packed rows get per-example attention (`packing`: model.packing_mode).
    """
    inputs, targets = modeling.forward_inputs(batch, packing)
    with autocast:
        logits = model(**inputs, use_cache=False).logits  # no KV cache in training
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE, reduction="sum")


@torch.no_grad()
def evaluate(raw_model: torch.nn.Module, examples: list[data.Example], cfg: TrainConfig, info: distributed.DistInfo,
             autocast: contextlib.AbstractContextManager, pad_id: int, sharded: bool = False) -> float:
    """Token-weighted eval loss over the whole eval set (each example on exactly one rank).
    `sharded` (FSDP): every rank runs the same number of forwards (see `fsdp.eval_lockstep`)."""
    raw_model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=info.device)
    batches = list(data.eval_batches(examples, rank=info.rank, world_size=info.world_size, batch_size=cfg.batch_size, pad_id=pad_id))
    steps = fsdp.eval_lockstep(batches, data.collate(examples[:1], pad_id), len(examples), info.world_size,
                               cfg.batch_size) if sharded else ((b, True) for b in batches)
    for batch, counts in steps:
        loss = loss_sum(raw_model, batch.to(info.device), autocast).double()
        if counts:
            total[0] += loss
            total[1] += batch.n_label_tokens
    raw_model.train()
    loss, count = distributed.all_reduce_sum(info, total).tolist()
    return loss / max(count, 1.0)


def train(cfg: TrainConfig, out: Path, info: distributed.DistInfo, stop: distributed.StopSignal) -> int:
    """Run (or resume) the whole job; returns the process exit code."""
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)  # the same seed on every rank: new modules (LoRA) start identical
    run_precision = precision.on_device(cfg.precision, cfg.strategy, info.device)  # the rules: precision.py
    amp_dtype = precision.autocast_dtype(run_precision)
    autocast = torch.autocast(info.device.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()
    log.info("device %s, world size %d, precision %s (%s), %s", info.device, info.world_size, cfg.precision,
             amp_dtype or torch.float32, modeling.hub_env_summary())

    # ---- model, data, resume point
    d = cfg.data
    base, tokenizer = modeling.load_model_and_tokenizer(modeling.resolve_model_path(cfg.model),
                                                        prefer_flash=d.packing and info.device.type == "cuda" and amp_dtype is not None)
    raw_model = modeling.apply_finetune(base, cfg).to(info.device)
    raw_model.train()  # from_pretrained returns eval mode: dropout would be off until the first eval
    n_trainable, n_total = modeling.count_parameters(raw_model)
    log.info("finetune %s: %s of %s parameters trainable (%.2f%%)", cfg.finetune, f"{n_trainable:,}", f"{n_total:,}",
             100 * n_trainable / n_total)
    train_set = data.load_examples(d.train, d.format, tokenizer, d.max_length, d.sample, cfg.seed)
    eval_set = data.load_examples(d.eval, d.format, tokenizer, d.max_length) if d.eval else None
    packing = modeling.packing_mode(raw_model) if d.packing else None  # how packed rows keep examples apart
    units = data.pack(train_set, d.max_length, cfg.seed) if packing else train_set  # packed rows, or examples
    if packing:
        log.info("packing %d examples into %d rows of up to %d tokens (%.1f%% filled; %s)", len(train_set), len(units),
                 d.max_length, 100 * sum(map(len, units)) / (len(units) * d.max_length), packing)
    steps_per_epoch = data.batches_per_epoch(len(units), info.world_size, cfg.batch_size) // cfg.grad_accum
    if steps_per_epoch == 0:
        raise TrainSetupError(f"{d.train}: {len(units)} {'packed rows' if d.packing else 'examples'} are fewer than one step "
                              f"(batch_size {cfg.batch_size} x grad_accum {cfg.grad_accum} x {info.world_size} processes)")
    total_steps = cfg.max_steps or cfg.epochs * steps_per_epoch
    ckpt = checkpoint.latest_checkpoint(out)
    seen = {str(c) for c in distributed.all_gather_object(info, ckpt and ckpt.name)}
    if len(seen) > 1:  # only rank 0 writes: other nodes see nothing without a shared filesystem
        raise TrainSetupError(f"ranks see different latest checkpoints {sorted(seen)}: resuming across nodes needs "
                              "the job folder's checkpoints/ on every node")
    if ckpt is not None:
        checkpoint.load_weights(raw_model, ckpt, cfg.finetune)

    # ---- DDP or FSDP, optimizer, schedule, scaler (requires_grad is final before the wrap)
    sharded = cfg.strategy == "fsdp" and info.enabled  # FSDP shards in place: raw_model is model
    ddp = info.world_size > 1 and not sharded
    if cfg.strategy == "fsdp" and not sharded:
        log.info("strategy fsdp without torchrun: one process, nothing to shard; training unsharded")
    model = DistributedDataParallel(
        raw_model, device_ids=[info.local_rank] if info.device.type == "cuda" else None,
        find_unused_parameters=False, gradient_as_bucket_view=True,
    ) if ddp else fsdp.shard(raw_model, info.device, amp_dtype) if sharded else raw_model
    no_sync = functools.partial(fsdp.no_sync, model) if sharded else model.no_sync if ddp else contextlib.nullcontext
    params = [p for p in raw_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=info.device.type in ("cuda", "cpu"))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, functools.partial(lr_factor, warmup=cfg.warmup_steps, total=total_steps, schedule=cfg.schedule))
    scaler = torch.amp.GradScaler(info.device.type, enabled=precision.uses_grad_scaler(run_precision))
    progress = checkpoint.Progress(world_size=info.world_size)
    if ckpt is not None:
        progress = checkpoint.load_training_state(info, ckpt, fsdp.OptimizerIO(model, optimizer) if sharded else optimizer,
                                                  scheduler, scaler)
        log.info("resuming from %s: step %d of %d (epoch %d)", ckpt, progress.step, total_steps, progress.epoch)
    step, epoch, step_in_epoch = progress.step, progress.epoch, progress.step_in_epoch
    tokens_seen, labels_seen = progress.tokens_seen, progress.label_tokens_seen
    saved_step = evaluated_step = step if ckpt is not None else -1

    # ---- the loop
    metrics_log = metrics.MetricsLog(out / "metrics.jsonl", info.is_main, start_step=step)
    peak_flops = metrics.device_peak_flops(info.device) if amp_dtype else None
    flops_per_token = metrics.flops_per_token(n_total, n_trainable)
    meter = metrics.Throughput()
    interval_loss = torch.zeros((), device=info.device)
    interval_slots = 0  # token positions computed, padding included
    log.info("training %d steps (%d per epoch), %d micro-batches of %d per step per process",
             total_steps, steps_per_epoch, cfg.grad_accum, cfg.batch_size)

    def save() -> None:
        nonlocal saved_step
        now = checkpoint.Progress(step, epoch, step_in_epoch, info.world_size, tokens_seen, labels_seen)
        states = fsdp.full_state_dicts(model, optimizer) if sharded else None  # every rank gathers, rank 0 writes
        checkpoint.save_checkpoint(info, out, raw_model, cfg, now, optimizer, scheduler, scaler, states=states)
        saved_step = step

    def report(lr: float, grad_norm: torch.Tensor) -> None:
        """metrics.jsonl + a progress line for the steps since the last report (syncs once)."""
        nonlocal interval_slots
        counts = torch.tensor([meter.label_tokens, meter.tokens, interval_slots], dtype=torch.float64)
        stats = torch.cat([interval_loss.double().cpu().view(1), counts])
        loss_total, label_total, token_total, slot_total = distributed.all_reduce_sum(info, stats).tolist()
        interval_loss.zero_()
        interval_slots = 0
        rates = meter.report(token_total, label_total)
        # useful tokens: non-padding tokens with a loss (= label tokens); padding: share of computed positions
        rates.update(useful_tokens_per_s=rates["label_tokens_per_s"], padding_fraction=1.0 - token_total / max(slot_total, 1.0))
        mfu = rates["tokens_per_s"] / info.world_size * flops_per_token / peak_flops if peak_flops else None
        row = {"step": step, "epoch": epoch, "loss": loss_total / max(label_total, 1.0), "lr": lr, "grad_norm": float(grad_norm),
               **rates, "peak_mem_mb": metrics.peak_memory_mb(info.device), "mfu": mfu}
        if scaler.is_enabled():
            row["scale"] = scaler.get_scale()
        metrics_log.write(row)
        log.info("step %d/%d | epoch %d | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | %.0f MiB", step, total_steps,
                 epoch, row["loss"], lr, row["grad_norm"], rates["tokens_per_s"], row["peak_mem_mb"])

    def run_eval() -> None:
        nonlocal evaluated_step
        eval_loss = evaluate(raw_model, eval_set, cfg, info, autocast, tokenizer.pad_token_id, sharded)
        evaluated_step, ppl = step, math.exp(min(eval_loss, 50.0))
        metrics_log.write({"step": step, "eval_loss": eval_loss, "eval_ppl": ppl})
        log.info("step %d | eval loss %.4f | perplexity %.2f", step, eval_loss, ppl)

    stopping = False  # set from the all-ranks stop vote, so every rank leaves the loop at the same step
    while step < total_steps and not stopping:
        if step_in_epoch >= steps_per_epoch:  # ">": resumed with more processes, so shorter epochs
            epoch, step_in_epoch = epoch + 1, 0
        batches = data.train_batches(units, rank=info.rank, world_size=info.world_size, batch_size=cfg.batch_size,
                                     seed=cfg.seed, epoch=epoch, start=step_in_epoch * cfg.grad_accum,
                                     pad_id=tokenizer.pad_token_id, group_by_length=d.group_by_length)
        while step_in_epoch < steps_per_epoch and step < total_steps:
            micro = [next(batches).to(info.device) for _ in range(cfg.grad_accum)]
            n_labels = sum(b.n_label_tokens for b in micro)
            # One CPU all-reduce per step: the step's label tokens over all ranks, and a stop vote.
            world_labels, stop_votes = distributed.all_reduce_sum(
                info, torch.tensor([n_labels, int(stop.requested)], dtype=torch.float64)).tolist()
            if stop_votes:
                stopping = True
                break
            weight = info.world_size / max(world_labels, 1.0)  # DDP averages over ranks; undo it
            for i, batch in enumerate(micro):
                sync = i == len(micro) - 1
                with no_sync() if not sync else contextlib.nullcontext():
                    loss = loss_sum(model, batch, autocast, packing)
                    scaler.scale(loss * weight).backward()
                interval_loss += loss.detach()
            lr = optimizer.param_groups[0]["lr"]
            grad_norm, _ = optimizer_step(params, optimizer, scheduler, scaler, cfg.max_grad_norm)
            step, step_in_epoch = step + 1, step_in_epoch + 1
            n_tokens = sum(b.n_tokens for b in micro)
            tokens_seen, labels_seen = tokens_seen + n_tokens, labels_seen + n_labels
            meter.add(n_tokens, n_labels)
            interval_slots += sum(b.input_ids.numel() for b in micro)

            if step % cfg.log_every == 0 or step == total_steps:
                report(lr, grad_norm)
            if eval_set and (step % cfg.eval_every == 0 or step == total_steps):
                run_eval()
            if step % cfg.save_every == 0 or step == total_steps:
                save()

    # ---- stop or finish
    if stopping:
        if step > saved_step and step > 0:
            save()
        log.warning("stopped by signal at step %d; resume continues from the latest checkpoint", step)
        metrics_log.close()
        return stop.exit_code
    if step != saved_step:
        save()
    if eval_set and evaluated_step != step:
        run_eval()
    if info.is_main:
        # A sharded model cannot be merged or pruned in place: export a fresh copy of the final checkpoint.
        final, tokenizer = fsdp.unsharded_copy(cfg, checkpoint.latest_checkpoint(out)) if sharded else (raw_model, tokenizer)
        report = export.export_outputs(final, tokenizer, cfg, out)
        metrics_log.write({"step": step, "export": report})
    distributed.barrier(info)
    metrics_log.close()
    log.info("done: %d steps, outputs in %s", step, out / "outputs")
    return 0


@record
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m remote_payload.train", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, type=Path, help="the resolved TrainConfig as JSON (train.json)")
    parser.add_argument("--out", required=True, type=Path, help="the job folder: metrics.jsonl, checkpoints/, outputs/")
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s [rank{rank}] %(levelname)s %(message)s", datefmt="%H:%M:%S")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", message="fan_in_fan_out is set to False")  # peft fixes it for GPT-2's Conv1D
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    # Right padding under causal attention needs no mask (see loss_sum); HF's advice does not apply.
    logging.getLogger("transformers.modeling_utils").addFilter(lambda r: "passing in an `attention_mask`" not in r.getMessage())
    distributed.die_with_parent()
    stop = distributed.StopSignal()
    info = distributed.setup()
    try:
        try:
            cfg = TrainConfig.model_validate_json(args.config.read_text())
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())
            raise TrainSetupError(f"cannot read the train config {args.config}: {problems}") from None
        except OSError as exc:
            raise TrainSetupError(f"cannot read the train config {args.config}: {exc}") from None
        args.out.mkdir(parents=True, exist_ok=True)
        return train(cfg, args.out, info, stop)
    except TrainSetupError as exc:
        log.error("%s", exc)
        return 2
    finally:
        distributed.cleanup()


if __name__ == "__main__":
    sys.exit(main())

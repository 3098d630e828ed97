"""The built-in trainer: fine-tune a Hugging Face causal LM (full / partial / LoRA) under torchrun.

    python -m torch.distributed.run --standalone --nproc_per_node N \\
        -m remote_payload.train --config JOB_DIR/train.json --out JOB_DIR

Reads a `TrainConfig` (JSON), writes under `--out`: `metrics.jsonl` (rank 0),
`checkpoints/step-<N>/` and `outputs/`. Resumes from the latest complete checkpoint in `--out`
when there is one. Exit codes: 0 done; 2 a configuration/data/model problem found before
training (one-line message in the log); 128+signal (143 for SIGTERM) when stopped by a signal
after writing a checkpoint; anything else is a crash with a traceback.

The entry point is `remote_payload/train.py` (`python -m remote_payload.train`).

Read top to bottom: `train` = `trainsetup.setup` (seed, precision, model, data, resume point,
DDP/FSDP, optimizer) → `micro_batches` / `train_step` per optimizer step → `Book` (report,
evaluate, save on their schedules) → `finish` (final save and eval, export). Each piece takes the
`Run` and can be called on its own.

Test hook: ``step_delay_s`` in ``test-hooks.json`` of the orch root the job folder is in (written
by the test harness, never by a job file: `remote_payload/contract/testhooks.py`) sleeps that
long after each step (it changes no number), so a tiny model's run lasts long enough for a
signal to arrive mid-run.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch.distributed.elastic.multiprocessing.errors import record

from remote_payload.contract import testhooks
from remote_payload.contract.train_config import TrainConfig, TrainSetupError
from remote_payload.trainer import board, checkpoint, data, distributed, export, fsdp, metrics, mixture
from remote_payload.trainer import model as modeling
from remote_payload.trainer import setup as trainsetup
from remote_payload.trainer import zero
from remote_payload.trainer.data import IGNORE
from remote_payload.trainer.setup import Run, lr_factor

__all__ = ["lr_factor", "optimizer_step", "loss_sum", "evaluate", "train", "main"]

log = logging.getLogger("remote_payload.train")


def optimizer_step(
    params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler, max_grad_norm: float | None, grad_factor: float = 1.0,
) -> tuple[torch.Tensor, bool]:
    """unscale → normalise and clip → step → update → zero_grad. The true gradient is `grad_factor`
    × the accumulated one (the token normalisation, known only after the backward); it is applied
    in the clip's own multiply, so normalising costs nothing extra. The scheduler steps only when
    the optimizer did (a GradScaler skips steps whose gradients hold inf/nan). Returns (the true
    gradient's norm before clipping, stepped)."""
    scaler.unscale_(optimizer)
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads) * grad_factor  # DTensor-aware: the global norm under FSDP
    if grads and (max_grad_norm is not None or grad_factor != 1.0):
        # as torch's clip_grads_with_norm_: one multiply, no host sync on the coefficient
        coef = grad_factor * torch.clamp(max_grad_norm / (norm + 1e-6), max=1.0) if max_grad_norm is not None \
            else torch.full_like(norm, grad_factor)
        torch._foreach_mul_(grads, coef)
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
             packing: str | None = None, head: torch.nn.Module | None = None) -> torch.Tensor:
    """Summed (not averaged) next-token cross-entropy over the batch's label tokens, in fp32.

    Unpacked batches pass no attention mask: they are right-padded and attention is causal, so
    padding never influences a real token (and pads are never targets), and SDPA takes its
    `is_causal` (flash) path. Packed rows get per-example attention (`packing`: model.packing_mode).
    With `head` (setup.output_head) the logits are computed at the labelled positions only
    (`modeling.labelled_logits`): the same sum, without the head's work on the other positions.
    """
    inputs, targets = modeling.forward_inputs(batch, packing)
    index = batch.label_index if head is not None else None
    with autocast, modeling.labelled_logits(head, index):
        logits = model(**inputs, use_cache=False).logits  # no KV cache in training
    targets = targets.flatten() if index is None else targets.flatten().index_select(0, index)
    return F.cross_entropy(logits.flatten(0, -2).float(), targets, ignore_index=IGNORE, reduction="sum")


@torch.no_grad()
def evaluate(raw_model: torch.nn.Module, examples: list[data.Example], cfg: TrainConfig, info: distributed.DistInfo,
             autocast: contextlib.AbstractContextManager, pad_id: int, sharded: bool = False,
             head: torch.nn.Module | None = None) -> float:
    """Token-weighted eval loss over the whole eval set (each example on exactly one rank).
    `sharded` (FSDP): every rank runs the same number of forwards (see `fsdp.eval_lockstep`).
    `head`: logits at labelled positions only (see `loss_sum`)."""
    raw_model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=info.device)
    batches = list(data.eval_batches(examples, rank=info.rank, world_size=info.world_size, batch_size=cfg.batch_size, pad_id=pad_id))
    steps = fsdp.eval_lockstep(batches, data.collate(examples[:1], pad_id), len(examples), info.world_size,
                               cfg.batch_size) if sharded else ((b, True) for b in batches)
    for batch, counts in steps:
        loss = loss_sum(raw_model, batch.to(info.device), autocast, head=head).double()
        if counts:
            total[0] += loss
            total[1] += batch.n_label_tokens
    raw_model.train()
    loss, count = distributed.all_reduce_sum(info, total).tolist()
    return loss / max(count, 1.0)


def micro_batches(run: Run) -> Iterator[list[data.Batch]]:
    """The `grad_accum` micro-batches of each optimizer step, from where `run.progress` stands up to
    `run.total_steps`, on this rank's device. The caller advances `run.progress` between items;
    an epoch that is over (">": resumed with more processes, so shorter epochs) starts the next one."""
    cfg, info = run.cfg, run.info
    while run.progress.step < run.total_steps:
        if run.progress.step_in_epoch >= run.steps_per_epoch:
            run.progress = replace(run.progress, epoch=run.progress.epoch + 1, step_in_epoch=0)
        batches = data.train_batches(run.units, rank=info.rank, world_size=info.world_size, batch_size=cfg.batch_size,
                                     seed=cfg.seed, epoch=run.progress.epoch, start=run.progress.step_in_epoch * cfg.grad_accum,
                                     pad_id=run.tokenizer.pad_token_id, group_by_length=cfg.data.group_by_length)
        while run.progress.step_in_epoch < run.steps_per_epoch and run.progress.step < run.total_steps:
            yield [next(batches).to(info.device) for _ in range(cfg.grad_accum)]


@dataclass
class Interval:
    """What this rank did since the last report: summed label loss (on the device: no host sync per
    step), token counts and rates (`meter`), and token positions computed, padding included."""

    loss: torch.Tensor
    meter: metrics.Throughput = field(default_factory=metrics.Throughput)
    slots: int = 0


def train_step(run: Run, micro: list[data.Batch], interval: Interval,
               stop: distributed.StopSignal) -> tuple[float, torch.Tensor, bool]:
    """One optimizer step over `micro`, token-weighted across micro-batches and ranks; advances
    `run.progress`. Returns (the lr it used, the gradient norm before clipping, whether any rank
    was asked to stop: every rank then stops after this same step).

    The step's label-token count over all ranks (with the stop vote) is summed by an all-reduce
    that runs while the micro-batches compute, not a barrier before them: the backward uses a
    constant weight (the same on every rank, so DDP's averaging stays linear) and the optimizer
    step applies the exact token normalisation to the gradients (`optimizer_step`'s grad_factor).
    Under DeepSpeed (`run.engine`), which clips inside its own step, the count is waited for first
    and the exact weight goes into the backward (zero.py)."""
    cfg, info = run.cfg, run.info
    n_labels = sum(b.n_label_tokens for b in micro)
    n_sources = len(run.progress.mix_seen)  # data.mix: the step's examples per source ride on the same all-reduce
    mixed = mixture.per_source([s for b in micro for s in b.sources], n_sources) if n_sources else []
    votes = torch.tensor([n_labels, int(stop.requested), *mixed], dtype=torch.float64)
    counting = distributed.all_reduce_sum_async(info, votes)
    weight = 1.0 / (cfg.batch_size * cfg.data.max_length * cfg.grad_accum)  # keeps fp16 gradients in range
    lr = run.optimizer.param_groups[0]["lr"]
    if run.engine is not None:  # strategy: deepspeed
        counting.wait()
        world_labels, stop_votes, *world_mixed = votes.tolist()
        interval.loss += zero.accumulate(run.engine, micro, lambda b: loss_sum(run.model, b, run.autocast(), run.packing, run.head),
                                         info.world_size / max(world_labels, 1.0))
        grad_norm, stepped = zero.stepped(run.engine)
        if stepped:
            run.scheduler.step()
    else:
        for i, batch in enumerate(micro):
            with run.no_sync() if i < len(micro) - 1 else contextlib.nullcontext():
                loss = loss_sum(run.model, batch, run.autocast(), run.packing, run.head)
                run.scaler.scale(loss * weight).backward()
            interval.loss += loss.detach()
        counting.wait()
        world_labels, stop_votes, *world_mixed = votes.tolist()
        grad_factor = info.world_size / (weight * max(world_labels, 1.0))  # DDP averaged over ranks: undo it
        grad_norm, _ = optimizer_step(run.params, run.optimizer, run.scheduler, run.scaler, cfg.max_grad_norm, grad_factor)
    n_tokens = sum(b.n_tokens for b in micro)
    p = run.progress
    run.progress = replace(p, step=p.step + 1, step_in_epoch=p.step_in_epoch + 1, tokens_seen=p.tokens_seen + n_tokens,
                           label_tokens_seen=p.label_tokens_seen + n_labels,
                           mix_seen=tuple(a + round(b) for a, b in zip(p.mix_seen, world_mixed)))
    interval.meter.add(n_tokens, n_labels)
    interval.slots += sum(b.input_ids.numel() for b in micro)
    return lr, grad_norm, bool(stop_votes)


class Book:
    """Reports, evaluations and checkpoints on their schedules (rank 0 writes metrics.jsonl)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.log = metrics.MetricsLog(run.out / "metrics.jsonl", run.info.is_main, start_step=run.progress.step)
        self.interval = Interval(loss=torch.zeros((), device=run.info.device))
        self.saved_step = self.evaluated_step = run.progress.step if run.resumed else -1
        self.peak_flops = metrics.device_peak_flops(run.info.device) if run.amp_dtype else None
        self.flops_per_token = metrics.flops_per_token(run.n_total, run.n_trainable)
        self.board = board.Board.open(run.cfg.tensorboard, run.info.is_main, run.out, run.progress.step if run.resumed else None)
        self.write_mix()

    def write_mix(self) -> None:
        """data.mix: `mix.json` (rank 0) with what each source gave, was drawn and was trained on so far."""
        run = self.run
        if run.mixed is None or not run.info.is_main or run.cfg.data.mix is None:
            return
        mixture.write_report(run.out, mixture.report(run.cfg.data.mix, run.cfg.data.mix_strategy, run.mixed.sizes,
                                                     run.mixed.wanted, run.progress.mix_seen, run.progress.step))

    def write(self, row: dict[str, object]) -> None:
        """A metrics.jsonl row, and the same numbers to TensorBoard (train.tensorboard)."""
        self.log.write(row)
        self.board.scalars(row)

    def report_due(self, lr: float, grad_norm: torch.Tensor) -> None:
        """Report the step when the schedule says so (a collective: every rank calls it)."""
        step = self.run.progress.step
        if step % self.run.cfg.log_every == 0 or step == self.run.total_steps:
            self.report(lr, grad_norm)

    def after_step(self, lr: float, grad_norm: torch.Tensor) -> None:
        cfg, step, last = self.run.cfg, self.run.progress.step, self.run.progress.step == self.run.total_steps
        self.report_due(lr, grad_norm)
        if self.run.eval_set and (step % cfg.eval_every == 0 or last):
            self.evaluate()
        if step % cfg.save_every == 0 or last:
            self.save()

    def report(self, lr: float, grad_norm: torch.Tensor) -> None:
        """metrics.jsonl + a progress line for the steps since the last report: one all-reduce of the
        interval's loss, token counts and every rank's peak memory (its own slot, zeros elsewhere)."""
        run, iv, info = self.run, self.interval, self.run.info
        peaks = torch.zeros(info.world_size, dtype=torch.float64)
        peaks[info.rank] = metrics.peak_memory_mb(info.device)
        counts = torch.tensor([iv.meter.label_tokens, iv.meter.tokens, iv.slots], dtype=torch.float64)
        stats = distributed.all_reduce_sum(info, torch.cat([iv.loss.double().cpu().view(1), counts, peaks])).tolist()
        loss_total, label_total, token_total, slot_total, rank_peaks = *stats[:4], stats[4:]
        iv.loss.zero_()
        iv.slots = 0
        rates = iv.meter.report(token_total, label_total)
        # useful tokens: the non-padding ones (each gets attention, and a loss unless it is a masked prompt)
        rates.update(useful_tokens_per_s=rates["tokens_per_s"], padding_fraction=1.0 - token_total / max(slot_total, 1.0))
        mfu = rates["tokens_per_s"] / info.world_size * self.flops_per_token / self.peak_flops if self.peak_flops else None
        p = run.progress
        row = {"step": p.step, "epoch": p.epoch, "loss": loss_total / max(label_total, 1.0), "lr": lr, "grad_norm": float(grad_norm),
               **rates, "peak_mem_mb": max(rank_peaks), "peak_mem_mb_per_rank": rank_peaks, "mfu": mfu}
        if run.scaler.is_enabled():
            row["scale"] = run.scaler.get_scale()
        elif run.engine is not None and (scale := zero.loss_scale(run.engine)) is not None:
            row["scale"] = scale
        if run.cfg.data.mix:
            row["mix_seen"] = {m.name: n for m, n in zip(run.cfg.data.mix, run.progress.mix_seen)}
        self.write(row)
        self.write_mix()
        log.info("step %d/%d | epoch %d | loss %.4f | lr %.2e | grad norm %.3f | %.0f tok/s | %.0f MiB", p.step,
                 run.total_steps, p.epoch, row["loss"], lr, row["grad_norm"], rates["tokens_per_s"], row["peak_mem_mb"])

    def close(self) -> None:
        self.log.close()
        self.board.close()

    def evaluate(self) -> None:
        run = self.run
        eval_loss = evaluate(run.raw_model, run.eval_set, run.cfg, run.info, run.autocast(), run.tokenizer.pad_token_id,
                             run.sharded, run.head)
        self.evaluated_step, ppl = run.progress.step, math.exp(min(eval_loss, 50.0))
        self.write({"step": run.progress.step, "eval_loss": eval_loss, "eval_ppl": ppl})
        log.info("step %d | eval loss %.4f | perplexity %.2f", run.progress.step, eval_loss, ppl)

    def save(self) -> None:
        run = self.run
        shards = None
        if run.engine is not None:  # fp32 weights consolidated on rank 0; each rank writes its DeepSpeed partition
            states = (zero.full_state_dict(run.engine, run.raw_model, run.cfg.finetune == "lora", run.info.is_main), None)
            shards = functools.partial(zero.save_shards, run.engine)
        else:
            states = fsdp.full_state_dicts(run.model, run.optimizer) if run.sharded else None  # all gather, rank 0 writes
        checkpoint.save_checkpoint(run.info, run.out, run.raw_model, run.cfg, run.progress, run.optimizer, run.scheduler,
                                   run.scaler, states=states, shards=shards)
        self.saved_step = run.progress.step


def finish(run: Run, book: Book, stopped: distributed.StopSignal | None) -> int:
    """After the loop: checkpoint what is not saved yet; when stopped by a signal, return its exit
    code; else evaluate (if not done at this step), export outputs/ (rank 0) and return 0."""
    step = run.progress.step
    if stopped is not None:
        if step > book.saved_step and step > 0:
            book.save()
        log.warning("stopped by signal at step %d; resume continues from the latest checkpoint (exit code %d)", step,
                    stopped.exit_code)
        book.close()
        return stopped.exit_code
    if step != book.saved_step:
        book.save()
    if run.eval_set and book.evaluated_step != step:
        book.evaluate()
    if run.info.is_main:
        # A sharded (or DeepSpeed's) model cannot be merged or pruned in place: export a fresh copy of the final checkpoint.
        final, tokenizer = (fsdp.unsharded_copy(run.cfg, checkpoint.latest_checkpoint(run.out))
                            if run.sharded or run.engine is not None
                            else (run.raw_model, run.tokenizer))
        exported = export.export_outputs(final, tokenizer, run.cfg, run.out)
        book.log.write({"step": step, "export": exported})
    distributed.barrier(run.info)
    book.close()
    log.info("done: %d steps, outputs in %s", step, run.out / "outputs")
    return 0


def train(cfg: TrainConfig, out: Path, info: distributed.DistInfo, stop: distributed.StopSignal) -> int:
    """Run (or resume) the whole job: setup → steps (report / evaluate / save on schedule) → finish.
    Returns the process exit code."""
    run = trainsetup.setup(cfg, out, info)
    book = Book(run)
    log.info("training %d steps (%d per epoch), %d micro-batches of %d per step per process",
             run.total_steps, run.steps_per_epoch, cfg.grad_accum, cfg.batch_size)
    slow = testhooks.step_delay_s(str(out.resolve().parent.parent))  # tests: a long run from a tiny model
    for micro in micro_batches(run):
        lr, grad_norm, stopping = train_step(run, micro, book.interval, stop)
        if stopping:  # the step is taken: report it when due and checkpoint it; no evaluation or export
            book.report_due(lr, grad_norm)
            return finish(run, book, stop)
        book.after_step(lr, grad_norm)
        if slow:
            time.sleep(slow)
    return finish(run, book, None)


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
    # transformers 5 renamed gradient to activation checkpointing; peft's k-bit preparation still uses the old names
    warnings.filterwarnings("ignore", message=".*(is_gradient_checkpointing|gradient_checkpointing_enable).*", category=FutureWarning)
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


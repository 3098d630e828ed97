"""Checkpoints: atomic saves, finding the latest complete one, and exact restore.

Layout of `<out>/checkpoints/step-<N>/` (N = optimizer steps done):

    model.safetensors, config.json      full / partial: the whole unwrapped model, fp32 (save_pretrained)
    adapter_model.safetensors,          lora: the peft adapter only
      adapter_config.json
    trainer_state.pt                    optimizer, scheduler and GradScaler state_dicts (DeepSpeed: no optimizer)
    deepspeed/state/                    strategy deepspeed: DeepSpeed's own sharded state, one optimizer
                                          partition per rank (zero.py), written before COMPLETE
    rng.pt                              per-rank RNG states (python, numpy, torch, cuda), indexed by rank
    progress.json                       step, epoch, step_in_epoch, world_size, tokens seen
    train.json                          the resolved TrainConfig
    COMPLETE                            written last

Contracts: `save_checkpoint` is a collective (every rank calls it; rank 0 writes; a barrier
ends it). A save is written to `tmp-<N>/`, fsynced, marked COMPLETE and only then renamed to
`step-<N>/`, so a crash mid-save never damages the previous checkpoint; older checkpoints are
pruned only after the rename. `latest_checkpoint` considers only `step-*` folders with COMPLETE. Nodes without a shared disk:
fanout.py copies the newest checkpoint to the others when a run starts (into `tmp-recv-<N>/`,
verified, then renamed the same way).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from remote_payload.contract.train_config import TrainConfig
from remote_payload.trainer import distributed
from remote_payload.trainer.distributed import DistInfo

log = logging.getLogger(__name__)
COMPLETE = "COMPLETE"


@dataclass(frozen=True)
class Progress:
    """Where a run stands after `step` optimizer steps."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0  # optimizer steps already taken in `epoch`
    world_size: int = 1
    tokens_seen: int = 0
    label_tokens_seen: int = 0
    mix_seen: tuple[int, ...] = ()  # data.mix: examples trained on per source, all ranks


def _step_of(path: Path) -> int:
    return int(path.name.split("-", 1)[1])


def complete_checkpoints(out: Path) -> list[Path]:
    """Complete checkpoints under `out/checkpoints`, oldest first."""
    root = out / "checkpoints"
    found = [p for p in root.glob("step-*") if p.name[5:].isdigit() and (p / COMPLETE).is_file()] if root.is_dir() else []
    return sorted(found, key=_step_of)


def latest_checkpoint(out: Path) -> Path | None:
    found = complete_checkpoints(out)
    return found[-1] if found else None


def _rng_state(device: torch.device) -> dict[str, object]:
    state: dict[str, object] = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def fsync_tree(path: Path) -> None:
    """fsync every file and folder under `path`, and `path` itself."""
    for p in [*path.rglob("*"), path]:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def save_checkpoint(
    info: DistInfo, out: Path, raw_model: torch.nn.Module, cfg: TrainConfig, progress: Progress,
    optimizer: torch.optim.Optimizer, scheduler: object, scaler: torch.amp.GradScaler,
    states: tuple[dict, dict | None] | None = None, shards: Callable[[Path], None] | None = None,
) -> Path:
    """Write `checkpoints/step-<progress.step>/` (collective; see the module contract).

    `states`: the (model, optimizer) full state dicts, already gathered to rank 0 (FSDP; see
    fsdp.py; DeepSpeed's optimizer state is None: it is in its shards); None takes them from
    `raw_model` and `optimizer` (DDP / one process). `shards(folder)`: every rank writes its own
    part into the unfinished folder (DeepSpeed's partitions, zero.save_shards; the folder must be
    on a disk all ranks share) before rank 0 marks it COMPLETE."""
    rng = distributed.all_gather_object(info, _rng_state(info.device))
    root = out / "checkpoints"
    final = root / f"step-{progress.step}"
    tmp = root / f"tmp-{progress.step}"
    if info.is_main:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob("tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir()
    if shards is not None:
        distributed.barrier(info)  # the folder exists before any rank writes into it
        shards(tmp)
    if info.is_main:
        model_state, optimizer_state = states or (None, optimizer.state_dict())
        raw_model.save_pretrained(tmp, safe_serialization=True, state_dict=model_state)
        torch.save(
            {"optimizer": optimizer_state, "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict()},
            tmp / "trainer_state.pt",
        )
        torch.save(rng, tmp / "rng.pt")
        (tmp / "progress.json").write_text(json.dumps(asdict(progress), indent=1))
        (tmp / "train.json").write_text(cfg.model_dump_json(indent=1))
        fsync_tree(tmp)
        (tmp / COMPLETE).write_text(f"step {progress.step}\n")
        fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for old in complete_checkpoints(out)[: -cfg.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        log.info("saved checkpoint %s", final)
    distributed.barrier(info)
    return final


def load_weights(raw_model: torch.nn.Module, ckpt: Path, finetune: str) -> None:
    """Load a checkpoint's trained weights into the (freshly built, same-shaped) unwrapped model."""
    from safetensors.torch import load_file

    if finetune == "lora":
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(raw_model, load_file(ckpt / "adapter_model.safetensors"))
        if result.unexpected_keys:
            raise RuntimeError(f"{ckpt}: adapter keys not in the model: {result.unexpected_keys[:5]}")
        return
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(ckpt.glob("*.safetensors")):
        state.update(load_file(shard))
    result = raw_model.load_state_dict(state, strict=False)
    params = dict(raw_model.named_parameters(remove_duplicate=False))
    loaded = {id(params[k]) for k in state if k in params}
    # A key save_pretrained left out is fine only when it is tied to one that was loaded (lm_head/wte).
    missing = [k for k in result.missing_keys if k not in params or id(params[k]) not in loaded]
    if result.unexpected_keys or missing:
        raise RuntimeError(f"{ckpt}: weights do not match the model (missing {missing[:5]}, unexpected {result.unexpected_keys[:5]})")


def load_training_state(
    info: DistInfo, ckpt: Path, optimizer: torch.optim.Optimizer, scheduler: object, scaler: torch.amp.GradScaler,
) -> Progress:
    """Restore optimizer, scheduler, scaler and this rank's RNG; return where the run stood."""
    state = torch.load(ckpt / "trainer_state.pt", map_location="cpu", weights_only=False)
    optimizer.load_state_dict(state["optimizer"])  # DeepSpeed: zero.NoOptimizerIO (its shards hold the state)
    scheduler.load_state_dict(state["scheduler"])
    scaler.load_state_dict(state["scaler"])
    progress = Progress(**json.loads((ckpt / "progress.json").read_text()))
    if progress.world_size != info.world_size:
        log.warning(
            "checkpoint was written by %d processes, resuming with %d: the data order and RNG streams "
            "continue approximately, not exactly", progress.world_size, info.world_size,
        )
    rng = torch.load(ckpt / "rng.pt", map_location="cpu", weights_only=False)
    mine = rng[info.rank % len(rng)]
    random.setstate(mine["python"])
    np.random.set_state(mine["numpy"])
    torch.set_rng_state(mine["torch"])
    if info.device.type == "cuda" and "cuda" in mine:
        torch.cuda.set_rng_state(mine["cuda"], info.device)
    return progress

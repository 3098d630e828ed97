"""Which precision runs with which strategy and device: the one home of these rules.

The laptop and the trainer both decide with this module:

- `config_problems(precision, strategy)`: what is wrong with a `train:` section's precision from
  its text alone (the `REFUSED` table). `orch check` and `orch submit` run it on the laptop
  (orchestrator/checks/laptop.py: exit 2 naming `train.precision` at its file:line:col); the trainer
  runs it again through `resolve`, so a hand-written train.json meets the same rule.
- `resolve(precision, strategy, device)`: the precision a run uses on a device (`auto` resolved,
  device-dependent refusals added), from a `DeviceCaps` description. Pure; the trainer gets its
  `DeviceCaps` from `remote_payload/trainer/precision.py` (`probe`) and calls it through `on_device`.
- `uses_grad_scaler(resolved)`: a GradScaler runs for fp16 only (bf16 has fp32's exponent range);
  under strategy: deepspeed DeepSpeed's own dynamic loss scaler does that job instead (its fp16
  section, remote_payload/contract/zeroconfig.py), so the trainer's GradScaler stays off there.

Contract: standard library only (the laptop has no torch); the half that asks torch about a
device is the trainer's (`remote_payload/trainer/precision.py`). Every refusal is a
`PrecisionError` (a `ValueError`) whose message is one line saying what to use instead.
"""

from __future__ import annotations

from dataclasses import dataclass

PRECISIONS = ("auto", "fp32", "fp16", "bf16")  # config.Precision, in the same order
STRATEGIES = ("ddp", "fsdp", "deepspeed")  # config.Strategy
RESOLVED = ("fp32", "fp16", "bf16")  # what `resolve` returns


class PrecisionError(ValueError):
    """A precision that cannot run with this strategy or on this device; the message is the
    whole one-line explanation."""


@dataclass(frozen=True)
class Refusal:
    """One combination refused from the job text alone: `precision` with `strategy`."""

    precision: str
    strategy: str
    reason: str


REFUSED: tuple[Refusal, ...] = (
    Refusal("fp16", "fsdp", "strategy: fsdp does not support fp16: GradScaler's inf check runs per rank on the sharded "
            "gradients, so ranks could disagree on skipping a step; use precision: bf16 or fp32 (or auto), or strategy: ddp"),
)


@dataclass(frozen=True)
class Problem:
    """What `config_problems` found: `field` is the `train:` field to point at."""

    field: str
    message: str


@dataclass(frozen=True)
class DeviceCaps:
    """What the rules need to know about the device a process trains on.

    `bf16`: bf16 kernels run natively (any CPU; CUDA compute capability 8.0+, not emulation).
    `fast_bf16`: bf16 matmuls beat fp32 there (CUDA GPUs with native bf16; CPUs with AMX).
    """

    kind: str  # torch.device.type: "cpu", "cuda", ...
    name: str
    bf16: bool
    fast_bf16: bool


def config_problems(precision: str, strategy: str) -> list[Problem]:
    """Every refusal of `REFUSED` that `precision` with `strategy` meets (an empty list: fine).
    Unknown names are the schema's business (config.Precision / config.Strategy), not refused here."""
    return [Problem("precision", r.reason) for r in REFUSED if (r.precision, r.strategy) == (precision, strategy)]


def resolve(precision: str, strategy: str, device: DeviceCaps) -> str:
    """The precision to run, one of `RESOLVED`, or `PrecisionError`.

    `auto` is bf16 where the device has fast bf16 and fp32 otherwise: never fp16, which needs a
    GradScaler (and is refused with fsdp). An explicit bf16 on a CUDA GPU without native bf16 is
    refused; on a CPU it runs (slowly without AMX). fp16 and fp32 run everywhere the table allows.
    """
    problems = config_problems(precision, strategy)
    if problems:
        raise PrecisionError(problems[0].message)
    if precision == "auto":
        return "bf16" if device.fast_bf16 else "fp32"
    if precision == "bf16" and device.kind == "cuda" and not device.bf16:
        raise PrecisionError(f"precision bf16 is not supported natively on {device.name}; use precision: fp16 "
                             "(strategy: ddp only), fp32 or auto")
    if precision not in RESOLVED:
        raise PrecisionError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    return precision


def uses_grad_scaler(resolved: str) -> bool:
    """Whether a run in `resolved` precision scales its loss (`torch.amp.GradScaler`): fp16 only."""
    return resolved == "fp16"

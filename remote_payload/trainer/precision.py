"""The trainer's half of the precision rules: what torch says about the device, the autocast
dtype, and the rules of ``remote_payload.contract.precision`` applied on the device.

A refusal on the device is the trainer's ``TrainSetupError`` (exit 2, one line).
"""

from __future__ import annotations

import torch

from remote_payload.contract import precision as rules
from remote_payload.contract.train_config import TrainSetupError


def probe(device: torch.device) -> rules.DeviceCaps:
    """`DeviceCaps` of `device`, asked from torch."""
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return rules.DeviceCaps("cuda", torch.cuda.get_device_name(device), bf16=native, fast_bf16=native)
    if device.type == "cpu":
        amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
        return rules.DeviceCaps("cpu", "CPU" + (" with AMX" if amx else ""), bf16=True, fast_bf16=bool(amx))
    return rules.DeviceCaps(device.type, device.type, bf16=True, fast_bf16=False)


def autocast_dtype(resolved: str) -> torch.dtype | None:
    """The `torch.autocast` dtype of a resolved precision; None for fp32 (no autocast)."""
    return {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[resolved]


def on_device(precision: str, strategy: str, device: torch.device) -> str:
    """`resolve` for the trainer's device; a refusal is raised as `TrainSetupError` (exit 2)."""
    try:
        return rules.resolve(precision, strategy, probe(device))
    except rules.PrecisionError as exc:
        raise TrainSetupError(str(exc)) from None

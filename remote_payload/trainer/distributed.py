"""Process-group setup from torchrun's environment, the few collectives the trainer uses, and
the stop signal.

Contract: every function here that communicates is a collective — every rank calls it, in the
same order. Without torchrun (no `RANK` in the environment) everything works as a single process
and no process group is created.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: its rank, its node-local rank, the world size and its device."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    control_group: object | None = None  # a gloo group for small CPU-side collectives when the backend is nccl

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return dist.is_available() and dist.is_initialized()


def setup() -> DistInfo:
    """Initialise the process group from torchrun's `RANK`, `LOCAL_RANK`, `WORLD_SIZE`.

    nccl on CUDA (one GPU per local rank), gloo on CPU. Rendezvous details (standalone or c10d
    across nodes) are torchrun's business: this only reads the environment it sets.
    """
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if "RANK" in os.environ and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=30), **kwargs)
    control = dist.new_group(backend="gloo") if dist.is_initialized() and device.type == "cuda" else None
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size, device=device, control_group=control)


def cleanup() -> None:
    """Destroy the process group if there is one (torchrun reports a failure otherwise)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def all_reduce_sum(info: DistInfo, tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over all ranks in place and return it.

    A CPU tensor goes through the gloo control group when the main backend is nccl, so the
    per-step bookkeeping never waits for the GPU's queue to drain.
    """
    all_reduce_sum_async(info, tensor).wait()
    return tensor


class _Done:
    """The handle of a collective that had nothing to do (one process)."""

    def wait(self) -> bool:
        return True


def all_reduce_sum_async(info: DistInfo, tensor: torch.Tensor) -> object:
    """Start summing `tensor` over all ranks in place; the returned handle's `wait()` ends it.
    CPU tensors go through the gloo control group when the main backend is nccl (as all_reduce_sum)."""
    if not info.enabled:
        return _Done()
    group = info.control_group if tensor.device.type == "cpu" else None
    return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=True)


def all_gather_object(info: DistInfo, obj: object) -> list[object]:
    """Every rank's `obj`, indexed by rank."""
    if not info.enabled:
        return [obj]
    out: list[object] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def die_with_parent() -> None:
    """Under torchrun, ask the kernel to SIGKILL this worker when the torchrun agent dies.

    torchrun starts every worker in its own session (`start_new_session=True`), so a signal sent
    to the agent's process group never reaches the workers: SIGTERM does only because the agent
    forwards it, and a SIGKILL of the agent would leave the workers training as orphans. Linux
    only; elsewhere a no-op.
    """
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the agent died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


class StopSignal:
    """Remembers the first SIGTERM/SIGINT; the trainer polls it between optimizer steps.

    The handler only sets a flag (safe to receive twice: torchrun's agent forwards the signal
    that the process group already delivered). Ranks agree on stopping through the per-step
    all-reduce in the training loop, so no rank is left waiting in a collective.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
            log.warning("received %s: stopping after the current step", signal.Signals(signum).name)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        """128 + the signal number (143 for SIGTERM), the shell convention."""
        return 128 + (self.signum or signal.SIGTERM)

"""The trainer's own process on its host: freed tensor memory kept for the next step (glibc).

On a CPU torch takes every tensor from malloc and frees it when autograd is done with it. glibc
serves blocks above its mmap threshold (128 KiB at first, adapting up to 32 MiB) with fresh
mappings and returns free memory at the top of its heap to the kernel beyond its trim threshold,
so a training step's activations (MiBs each) are page-faulted in and zeroed by the kernel again
every step: on the CPU bench's model (GPT-2 4x256, batch 8, max_length 512) about 17,000 page
faults per step, and some 5-10 % of a step's time. `keep_freed_memory` sets both thresholds high
(M_MMAP_THRESHOLD 32 MiB, glibc's largest; M_TRIM_THRESHOLD 1 GiB), so freed blocks stay in the
heap and the next step reuses them: a process keeps what its busiest step used, as the CUDA
caching allocator does on a GPU. Blocks of 32 MiB or more are still mapped and unmapped each time.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's upper limit for it on 64-bit (HEAP_MAX / 2)
TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (see the module docstring); True
    when applied. Not glibc (macOS, musl): nothing to do, False. Never raises."""
    if sys.platform != "linux":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")  # glibc's soname; musl and others have none by that name
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))

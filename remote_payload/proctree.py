"""A job's whole process tree, not only its process group (Linux, standard library only).

torchrun starts each worker in a session of its own, so signalling torchrun's process group
reaches only the agent, and a SIGKILLed agent leaves its workers running as orphans. The
supervisor therefore becomes a child subreaper (orphans re-parent to it, so they stay in its
tree), records the tree in status.json as ``[pid, start time]`` pairs, and signals every
member. The start time guards against a recycled pid.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Dict, Iterable, List, Tuple

PR_SET_CHILD_SUBREAPER = 36
Proc = Tuple[int, int]


def become_subreaper() -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> "Tuple[int, str, int] | None":
    """(ppid, state, start time) of ``pid``, or None."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            fields = f.read().rsplit(b")", 1)[-1].split()
    except OSError:
        return None
    return int(fields[1]), fields[0].decode(), int(fields[19])


def descendants(root: int) -> List[Proc]:
    """Every live (non-zombie) descendant of ``root`` as (pid, start time)."""
    children: Dict[int, List[int]] = {}
    info: Dict[int, Tuple[int, str, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                info[int(entry)] = st
                children.setdefault(st[0], []).append(int(entry))
    out: List[Proc] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        ppid, state, start = info[pid]
        if state != "Z":
            out.append((pid, start))
        todo.extend(children.get(pid, []))
    return out


def alive(procs: Iterable[Proc]) -> List[Proc]:
    """Those of ``procs`` that still run as the same process (pid and start time match)."""
    out = []
    for pid, start in procs:
        st = _stat(pid)
        if st is not None and st[1] != "Z" and st[2] == start:
            out.append((pid, start))
    return out


def signal_all(procs: Iterable[Proc], sig: int) -> None:
    for pid, _ in alive(procs):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop(procs: List[Proc], grace: float) -> None:
    """SIGTERM ``procs``, wait up to ``grace`` seconds, SIGKILL what is left, wait briefly."""
    signal_all(procs, signal.SIGTERM)
    deadline = time.time() + grace
    while alive(procs) and time.time() < deadline:
        time.sleep(0.1)
    signal_all(procs, signal.SIGKILL)
    deadline = time.time() + 5
    while alive(procs) and time.time() < deadline:
        time.sleep(0.05)

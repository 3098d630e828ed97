"""Processes on the host: this boot, a pid or process group alive, and a job's whole process tree
(Linux, standard library only).

``pid_alive``, ``group_alive`` and ``boot_id`` tell whether a recorded process still runs (a pid
is only trusted with its command line, a group while any non-zombie member is left, a record
only on the boot that wrote it). A job's tree is more than its process group:

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

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
PR_SET_CHILD_SUBREAPER = 36
Proc = Tuple[int, int]
EXEC_SETTLE_S = 0.5  # the longest an exec's empty command line is waited out (pid_alive)


def boot_id() -> str:
    """This boot of the machine (changes on restart); ``"unknown"`` where the kernel does not say."""
    try:
        with open(BOOT_ID_FILE, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def pid_alive(pid: int, needle: str = "") -> bool:
    """True when ``pid`` runs and (if given) its command line contains ``needle``.

    A process that is being exec'd shows an empty command line for a moment: the kernel closes
    its close-on-exec files (which is when a ``subprocess.Popen`` returns) before it lays out the
    new program's arguments. An empty command line is therefore read again for up to
    ``EXEC_SETTLE_S`` before the answer is no (kernel threads, whose line stays empty, cost that
    wait and are no)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if not needle:
        return True
    deadline = time.monotonic() + EXEC_SETTLE_S
    while True:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmdline = f.read()
            with open("/proc/%d/stat" % pid, "rb") as f:
                zombie = f.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
        except OSError:
            return False
        if cmdline or zombie or time.monotonic() >= deadline:
            return needle.encode() in cmdline and not zombie
        time.sleep(0.002)


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process belongs to process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry, "rb") as f:
                fields = f.read().rsplit(b")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) > 2 and fields[0] != b"Z" and int(fields[2]) == pgid:
            return True
    return False


def process_state(pid: int) -> "str | None":
    """The kernel's one-letter state of ``pid`` (``/proc/PID/stat``: R running, S sleeping,
    D uninterruptible disk sleep, T stopped by a signal, t stopped by a debugger, Z zombie,
    ...), or None when there is no such process. A process with any thread in ``D`` reads
    ``D``: its main thread may sleep (S) while the thread that would write its heartbeat is
    stuck on a hung disk."""
    if pid <= 0:
        return None
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            state = f.read().rsplit(b")", 1)[-1].split()[0].decode("ascii", "replace")
    except (OSError, IndexError):
        return None
    if state in ("R", "S"):
        try:
            tasks = os.listdir("/proc/%d/task" % pid)
        except OSError:
            tasks = []
        for tid in tasks:
            try:
                with open("/proc/%d/task/%s/stat" % (pid, tid), "rb") as f:
                    if f.read().rsplit(b")", 1)[-1].split()[0] == b"D":
                        return "D"
            except (OSError, IndexError):
                continue
    return state


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

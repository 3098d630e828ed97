"""The host's GPU queue: each job's supervisor waits here for its GPUs (standard library only).

There is no daemon. The queue is files under ``<root>/queue/``, and every supervisor that
waits schedules for everyone (``schedule``), so the queue goes on with the laptop closed and
with any supervisor killed or restarted:

- ``queue/.lock``: an ``flock`` held for every read-modify-write of the entries (short: no
  subprocess runs under it).
- ``queue/<job_id>.node<N>.json``: one entry per job node — its supervisor (pid, boot id, job
  folder), what it needs (``job.json``'s ``queue``: ``gpus`` as a count or ``"all"``,
  ``memory_gb`` per GPU, ``pinned`` indices from the job's own ``CUDA_VISIBLE_DEVICES``), its
  ``priority`` and ``since``; ``state`` is ``waiting`` until a pass grants it ``gpus``
  (``running``). The supervisor removes it when the job ends (``release``).
- ``queue/gpus.json``: the inventory the last look used (``inventory.py``; in tests, the
  harness's fake GPUs: ``contract/testhooks.py``, never the job's ``env:``), shared by the waiters and shown by ``orch queue``.

Contract:

- Never two jobs on one GPU: GPUs are granted only under the lock, and only GPUs that no live
  entry holds. An entry is live while its pid runs that job's supervisor in this boot, and a
  granted entry whose supervisor was killed stays live while any process of the job's tree
  that status.json recorded for that supervisor still runs (``holds``: the unsupervised job
  still uses its GPUs, whether nvidia-smi lists its processes or not); a pass removes any
  other, so the GPUs are free at the first pass after the job's last process ends (or
  ``orch cancel`` / ``orch resume`` stops them).
- GPUs busy with processes orch does not account for (another user's run: compute processes
  that nvidia-smi lists, or more than ``inventory.BUSY_MIB`` of memory in use) are never
  handed out.
- Order: higher ``priority`` first, then FIFO by ``since`` (when the supervisor began to wait;
  ``orch resume`` queues again at the back). Strict: a job that does not fit now blocks every
  job after it (no backfill), so a big job is never starved by a stream of small ones; a job
  that can never fit on this host (``never_fits``) blocks nobody — its supervisor fails it.
- A job that needs 0 GPUs, a Slurm job, a job of an older orch (no ``queue`` in job.json) and
  any job on a host where nvidia-smi finds no GPU never queue: they start at once, as before.
- The job gets ``CUDA_VISIBLE_DEVICES`` = its GPUs' nvidia-smi indices, with
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA numbers them as nvidia-smi does.
- Each node of a multi-node job queues on its own host; a node granted first starts, and
  torchrun's rendezvous waits for the others up to its join timeout (docs/queue.md).
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from remote_payload.contract import testhooks
from remote_payload.contract.jobfolder import atomic_write_json, read_json
from remote_payload.gpuqueue.inventory import Gpu, busy, inventory, recorded
from remote_payload.jobdir.lease import flock_within
from remote_payload.jobdir.processes import boot_id, pid_alive
from remote_payload.jobdir.status import read_status, survivors_of

TICK_S = 0.25        # a waiter looks at its own entry (granted? cancelled?) this often
PASS_S = 1.0         # and schedules (inventory + pass) this often
LOCK_WAIT_S = 30.0


class QueueBusy(Exception):
    """The queue's lock was not free within ``LOCK_WAIT_S``."""


def queue_dir(root: str) -> str:
    return os.path.join(root, "queue")


def inventory_path(root: str) -> str:
    return os.path.join(queue_dir(root), "gpus.json")


def entry_path(root: str, job_id: str, node_rank: int) -> str:
    return os.path.join(queue_dir(root), "%s.node%d.json" % (job_id, node_rank))


@contextmanager
def locked(root: str, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold the queue's flock (the kernel frees it if the holder dies); ``QueueBusy`` after ``wait_s``."""
    os.makedirs(queue_dir(root), exist_ok=True)
    with open(os.path.join(queue_dir(root), ".lock"), "a") as handle:
        if not flock_within(handle, wait_s, 0.02):
            raise QueueBusy("the GPU queue's lock (%s) is not free" % queue_dir(root))
        yield


# -- fitting ----------------------------------------------------------------------------------
def _count(need: Dict[str, Any], gpus: List[Gpu]) -> int:
    if need.get("pinned"):
        return len(need["pinned"])
    return len(gpus) if need.get("gpus") == "all" else int(need.get("gpus") or 0)


def _memory_ok(gpu: Gpu, memory_gb: Any, free: bool) -> bool:
    if not isinstance(memory_gb, (int, float)):
        return True
    have = gpu.get("total_mib")
    if free and have is not None and gpu.get("used_mib") is not None:
        have -= gpu["used_mib"]
    return have is None or have >= memory_gb * 1024


def never_fits(need: Dict[str, Any], gpus: List[Gpu]) -> Optional[str]:
    """Why a job can never start on a host with ``gpus`` (all of them idle), else None."""
    indices = [g["index"] for g in gpus]
    missing = [p for p in need.get("pinned") or [] if p not in indices]
    if missing:
        return "the job's CUDA_VISIBLE_DEVICES names GPU %s; this host has GPUs %s" % (
            ",".join(map(str, missing)), ",".join(map(str, indices)))
    n = _count(need, gpus)
    if n > len(gpus):
        return "launch.gpus: the job needs %d GPU(s); this host has %d" % (n, len(gpus))
    roomy = [g for g in gpus if _memory_ok(g, need.get("memory_gb"), free=False)
             and (not need.get("pinned") or g["index"] in need["pinned"])]
    if len(roomy) < n:
        return "launch.memory_gb: the job needs %d GPU(s) with %g GB each; this host has %d" % (
            n, need["memory_gb"], len(roomy))
    return None


def _choose(need: Dict[str, Any], free: List[Gpu], gpus: List[Gpu]) -> Optional[List[int]]:
    fits = [g["index"] for g in free if _memory_ok(g, need.get("memory_gb"), free=True)]
    if need.get("pinned"):
        return list(need["pinned"]) if set(need["pinned"]) <= set(fits) else None
    n = _count(need, gpus)
    return fits[:n] if len(fits) >= n else None


# -- entries and the pass ---------------------------------------------------------------------
def _order(entry: Dict[str, Any]) -> Tuple[Any, ...]:
    return (-entry["priority"], entry["since"], entry["job_id"], entry["node_rank"])


def _valid(entry: Any) -> bool:
    types = {"job_id": str, "node_rank": int, "pid": int, "boot_id": str, "job_dir": str, "state": str,
             "priority": int, "since": (int, float), "need": dict, "gpus": list}
    return isinstance(entry, dict) and all(isinstance(entry.get(k), t) for k, t in types.items()) \
        and all(isinstance(g, int) for g in entry["gpus"]) and _need_ok(entry["need"])


def _need_ok(need: Dict[str, Any]) -> bool:
    gpus, pinned, memory = need.get("gpus"), need.get("pinned"), need.get("memory_gb")
    return (gpus == "all" or (isinstance(gpus, int) and 0 <= gpus <= 1024)) \
        and (pinned is None or (isinstance(pinned, list) and all(isinstance(p, int) for p in pinned))) \
        and (memory is None or isinstance(memory, (int, float)))


def supervised(entry: Dict[str, Any]) -> bool:
    """The entry's supervisor runs (its pid, this boot, a command line naming its job)."""
    return entry["boot_id"] == boot_id() and pid_alive(entry["pid"], "supervisor") \
        and pid_alive(entry["pid"], entry["job_id"])


def holds(entry: Dict[str, Any]) -> bool:
    """True while the entry still counts: its supervisor runs, or, for a granted entry whose
    supervisor is gone, a process of the job's tree runs that status.json recorded for that very
    supervisor (same pid, this boot; each process checked with its start time)."""
    if supervised(entry):
        return True
    if entry["state"] != "running" or entry["boot_id"] != boot_id():
        return False
    st = read_status(os.path.join(entry["job_dir"], "status.json"))
    return isinstance(st, dict) and st.get("supervisor_pid") == entry["pid"] \
        and st.get("boot_id") == boot_id() and bool(survivors_of(st))


def entries(root: str) -> List[Tuple[str, Dict[str, Any]]]:
    """Live entries (path, entry); removes dead and unreadable ones. Call under ``locked``."""
    out = []
    try:
        names = sorted(os.listdir(queue_dir(root)))
    except OSError:
        return []
    for name in names:
        if not name.endswith(".json") or ".node" not in name:
            continue
        path = os.path.join(queue_dir(root), name)
        entry = read_json(path)
        if _valid(entry) and holds(entry):
            out.append((path, entry))
        else:
            try:
                os.unlink(path)
            except OSError:
                pass
    return out


def schedule(root: str, gpus: List[Gpu], grant: bool = True) -> Dict[str, Any]:
    """One pass, under ``locked``: grant waiting entries in order while they fit (strict: the
    first that does not fit stops the granting). Returns ``positions`` (entry file name -> its
    place among those still waiting, from 1), the ``free`` and ``busy`` (foreign) indices."""
    live = entries(root)
    held = {g for _, e in live if e["state"] == "running" for g in e["gpus"]}
    foreign = [g["index"] for g in gpus if g["index"] not in held and busy(g)]
    free = [g for g in gpus if g["index"] not in held and g["index"] not in foreign]
    out: Dict[str, Any] = {"positions": {}, "free": [g["index"] for g in free], "busy": foreign}
    blocked = not grant
    for path, entry in sorted(((p, e) for p, e in live if e["state"] == "waiting"), key=lambda pe: _order(pe[1])):
        if never_fits(entry["need"], gpus) is not None:
            continue
        pick = None if blocked else _choose(entry["need"], free, gpus)
        if pick is None:
            blocked = True
            out["positions"][os.path.basename(path)] = len(out["positions"]) + 1
            continue
        atomic_write_json(path, dict(entry, state="running", gpus=pick, granted=time.time()))
        free = [g for g in free if g["index"] not in pick]
    return out


# -- a supervisor's part ---------------------------------------------------------------------
def needs(job: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """What the job queues for (job.json's ``queue``), or None when it never queues."""
    need = job.get("queue")
    if job.get("slurm") or not isinstance(need, dict) or not _need_ok(need) or need.get("gpus") == 0:
        return None
    return {"gpus": need["gpus"], "memory_gb": need.get("memory_gb"), "pinned": need.get("pinned") or None,
            "priority": need.get("priority") if isinstance(need.get("priority"), int) else 0}


def take(job_dir: str, job: Dict[str, Any], node_rank: int, env: Dict[str, str], cancelled: threading.Event,
         update: Callable[..., None], say: Callable[[str], None]) -> Tuple[Dict[str, str], Optional[str]]:
    """Wait for this node's GPUs: ``(env, None)`` with ``CUDA_VISIBLE_DEVICES`` set once they
    are granted (or ``env`` unchanged when the job does not queue, or when ``cancelled`` is set
    while it waits); ``(env, reason)`` when the job can never start here. While it waits the
    status is ``queued`` with ``queue_position``; once granted ``setting_up`` with ``gpus``."""
    need = needs(job)
    if need is None:
        return env, None
    root = os.path.dirname(os.path.dirname(job_dir))
    gpus = inventory(inventory_path(root), testhooks.fake_gpus(root))["gpus"]
    if not gpus:
        return env, None
    path = entry_path(root, job["job_id"], node_rank)
    entry = {"job_id": job["job_id"], "node_rank": node_rank, "pid": os.getpid(), "boot_id": boot_id(),
             "job_dir": job_dir, "state": "waiting", "priority": int(need.get("priority") or 0), "since": time.time(),
             "need": need, "gpus": []}
    shown: Any = -1
    last, seen = 0.0, {"positions": {}, "busy": []}
    while True:
        problem = never_fits(need, gpus)
        if cancelled.is_set() or problem is not None:
            _drop(root, path)
            if problem is not None:
                say(problem)
            return env, problem
        if time.time() - last >= PASS_S:
            try:
                with locked(root):
                    mine = read_json(path)
                    if not isinstance(mine, dict) or mine.get("pid") != os.getpid():
                        atomic_write_json(path, entry)  # the first time, or a pass took this entry for dead
                    seen = schedule(root, gpus)
            except QueueBusy as exc:
                say("%s; trying again" % exc)
            last = time.time()
        mine = read_json(path)
        if isinstance(mine, dict) and mine.get("state") == "running" and mine.get("pid") == os.getpid():
            break
        position = seen["positions"].get(os.path.basename(path))
        why = "waiting for %d GPU(s)%s" % (_count(need, gpus), "; busy with other processes: GPU %s" % (
            ",".join(map(str, seen["busy"]))) if seen["busy"] else "")
        if (position, why) != shown:
            shown = (position, why)
            update(state="queued", queue_position=position, reason=why)
            say("queued%s: %s" % (" #%d" % position if position else "", why))
        cancelled.wait(TICK_S)
        if time.time() - last >= PASS_S:
            gpus = inventory(inventory_path(root), testhooks.fake_gpus(root))["gpus"] or gpus
    update(state="setting_up", queue_position=None, reason=None, gpus=mine["gpus"])
    say("GPU(s) %s granted" % ",".join(map(str, mine["gpus"])))
    out = dict(env, CUDA_VISIBLE_DEVICES=",".join(map(str, mine["gpus"])), CUDA_DEVICE_ORDER="PCI_BUS_ID")
    out["ORCH_GPUS"] = out["CUDA_VISIBLE_DEVICES"]
    return out, None


def _drop(root: str, path: str) -> None:
    """Remove this supervisor's entry, under the lock when it can be had within 5 s (without it
    too: a pass that read the entry only keeps its GPUs from others a moment longer)."""
    def mine() -> bool:
        entry = read_json(path)
        return isinstance(entry, dict) and entry.get("pid") == os.getpid()
    try:
        try:
            with locked(root, wait_s=5.0):
                if mine():
                    os.unlink(path)
        except QueueBusy:
            if mine():
                os.unlink(path)
    except OSError:
        pass


def release(job_dir: str, job_id: str, node_rank: int) -> None:
    """The job ended: its GPUs go back to the queue (no-op when it never queued). Never raises."""
    path = entry_path(os.path.dirname(os.path.dirname(job_dir)), job_id, node_rank)
    if os.path.exists(path):
        _drop(os.path.dirname(os.path.dirname(job_dir)), path)


def view(root: str) -> Dict[str, Any]:
    """``orch queue``'s reply: the inventory (this session's own look, or the last one a waiter
    recorded when this one finds no GPU) and every live entry, waiting ones with their place."""
    record = inventory(inventory_path(root), testhooks.fake_gpus(root))
    if not record["gpus"]:
        cached = read_json(inventory_path(root))
        if recorded(cached):
            record = cached
    if not os.path.isdir(queue_dir(root)):
        return {"gpus": record["gpus"], "jobs": [], "source": record["source"], "seen": record.get("seen")}
    with locked(root):
        seen = schedule(root, record["gpus"], grant=False)
        live = entries(root)
    holders = {g: e["job_id"] for _, e in live if e["state"] == "running" for g in e["gpus"]}
    gpus = [dict(g, busy=g["index"] in seen["busy"], holder=holders.get(g["index"])) for g in record["gpus"]]
    jobs = [{"job_id": e["job_id"], "node_rank": e["node_rank"], "state": e["state"], "gpus": e["gpus"],
             "need": e["need"].get("gpus"), "memory_gb": e["need"].get("memory_gb"), "priority": e["priority"],
             "since": e["since"], "granted": e.get("granted"), "unsupervised": not supervised(e),
             "position": seen["positions"].get(os.path.basename(p))}
            for p, e in sorted(live, key=lambda pe: (pe[1]["state"] != "running", _order(pe[1])))]
    return {"gpus": gpus, "jobs": jobs, "source": record["source"], "seen": record.get("seen")}

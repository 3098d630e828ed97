"""Multi-node resume without a shared disk: the newest complete checkpoint, on every filesystem.

    ckpt = share_latest(out, info)   # collective; None when no rank has a checkpoint

Only global rank 0 writes checkpoints, on whichever node torch gave it, so after a restart the
other nodes' job folders may lack the checkpoint (or hold an older one). `share_latest` fans the
newest one out before anything loads it:

1. every rank reports its latest complete step (`checkpoint.latest_checkpoint`); the newest step
   anywhere wins, and the lowest rank holding it is the source;
2. ranks group by filesystem: each creates `checkpoints/.fs-<nonce>` with O_EXCL (nonce fresh per
   start, from rank 0) or reads the rank that did; ranks that read the same creator share a folder.
   Every group that lacks the step gets one writer, its lowest rank;
3. the source and the writers form a gloo group (so NCCL jobs never move checkpoints through GPU
   memory, and ranks that need nothing receive nothing); the source broadcasts a listing
   (relative names, sizes, sha256) and then each file's bytes in chunks of `CHUNK_BYTES`, as
   uint8 tensors. A writer streams them into `checkpoints/tmp-recv-<N>/`, re-reads and checks
   every file's size and sha256, writes COMPLETE last, fsyncs, and renames to `step-<N>/`;
4. every rank learns every writer's outcome (an all-gather, which also ends the transfer on all
   ranks): any failure raises the same `TrainSetupError` everywhere; nothing unverified is ever
   named `step-<N>`.

Contracts: a collective (every rank calls it, in the same order). Memory: one chunk per transfer
member, never a whole file. A writer that fails to write keeps receiving (and discards) so the
source never waits on it; its failure is reported in step 4. When every rank already sees the
newest step (one node, a shared filesystem, an unchanged restart) nothing but one all-gather runs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import shutil
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch
import torch.distributed as dist

from remote_payload.contract.train_config import TrainSetupError
from remote_payload.trainer import checkpoint, distributed
from remote_payload.trainer.distributed import DistInfo

log = logging.getLogger("remote_payload.train")
CHUNK_BYTES = 32 << 20  # bytes per broadcast; one such buffer per transfer member
_READ_BYTES = 1 << 20


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint folder: its path relative to the folder (posix), size, sha256."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Plan:
    """What to send: checkpoint `step`, from rank `source`, to one writer rank per filesystem lacking it."""

    step: int
    source: int
    writers: tuple[int, ...]

    @property
    def members(self) -> list[int]:
        """The ranks of the transfer group, ascending."""
        return sorted({self.source, *self.writers})


def newest(steps: Sequence[int | None]) -> tuple[int, int] | None:
    """(the newest step, the lowest rank holding it) of ranks reporting latest complete `steps`
    (None: none); None when no rank has a checkpoint."""
    held = [s for s in steps if s is not None]
    if not held:
        return None
    step = max(held)
    return step, steps.index(step)


def plan(steps: Sequence[int | None], filesystems: Sequence[int]) -> Plan | None:
    """The transfer for ranks reporting latest complete `steps` (see `newest`) on `filesystems` (an
    id per rank; equal ids share one folder). None when no rank has a checkpoint. Each filesystem
    where no rank holds the newest step gets its lowest rank as writer (`writers` empty: nothing to send)."""
    found = newest(steps)
    if found is None:
        return None
    step, source = found
    have = {filesystems[r] for r, s in enumerate(steps) if s == step}
    writers: dict[int, int] = {}
    for rank, fs in enumerate(filesystems):
        if fs not in have:
            writers.setdefault(fs, rank)
    return Plan(step=step, source=source, writers=tuple(sorted(writers.values())))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_READ_BYTES):
            digest.update(block)
    return digest.hexdigest()


def listing(folder: Path) -> list[FileEntry]:
    """Every regular file under `folder` except COMPLETE, sorted by name, with size and sha256."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != checkpoint.COMPLETE)
    return [FileEntry(p.relative_to(folder).as_posix(), p.stat().st_size, sha256_of(p)) for p in files]


def verify(folder: Path, entries: Sequence[FileEntry]) -> list[str]:
    """What in `folder` differs from `entries` (missing files, sizes, sha256 read back from disk); [] if nothing."""
    problems = []
    for e in entries:
        path = folder / e.name
        if not path.is_file():
            problems.append(f"{e.name}: missing")
        elif (size := path.stat().st_size) != e.size:
            problems.append(f"{e.name}: {size} bytes, expected {e.size}")
        elif sha256_of(path) != e.sha256:
            problems.append(f"{e.name}: sha256 differs")
    return problems


def safe_name(name: str) -> bool:
    """Whether a listed name stays inside the folder it is written to."""
    p = PurePosixPath(name)
    return bool(name) and not p.is_absolute() and ".." not in p.parts


def filesystem_ids(out: Path, info: DistInfo, nonce: str) -> list[int]:
    """Collective: per rank, the rank that created `out/checkpoints/.fs-<nonce>` on its filesystem.
    Ranks with equal ids write into one folder (even across hosts, on a shared mount; a copied job
    folder never fools it, the nonce being fresh). The marker is removed once everyone has read it."""
    root = out / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    marker = root / f".fs-{nonce}"
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        owner = _read_marker(marker)
    else:
        with os.fdopen(fd, "w") as f:
            f.write(f"{info.rank}\n")
        owner = info.rank
    owners = [int(o) for o in distributed.all_gather_object(info, owner)]
    if owner == info.rank:  # every rank read it before the gather could end
        marker.unlink(missing_ok=True)
    return owners


def _read_marker(marker: Path, timeout: float = 60.0) -> int:
    """The rank in a marker another rank is writing (complete once it ends with a newline)."""
    deadline = time.monotonic() + timeout
    while not (text := marker.read_text()).endswith("\n"):
        if time.monotonic() > deadline:
            raise TrainSetupError(f"{marker}: another rank created it but never finished writing it")
        time.sleep(0.01)
    return int(text)


def _send(folder: Path, group: object, source: int) -> str | None:
    """The source's side: the listing, then every file's bytes. Returns an error or None."""
    try:
        header: dict = {"entries": listing(folder), "complete": (folder / checkpoint.COMPLETE).read_text()}
    except OSError as exc:
        header = {"error": f"cannot read {folder}: {exc}"}
    dist.broadcast_object_list([header], src=source, group=group)
    if "error" in header:
        return header["error"]
    buf = torch.empty(CHUNK_BYTES, dtype=torch.uint8)
    view = memoryview(buf.numpy())
    error = None
    for e in header["entries"]:
        try:
            f = (folder / e.name).open("rb")
        except OSError as exc:
            f, error = None, error or f"cannot read {folder / e.name}: {exc}"
        for offset in range(0, e.size, CHUNK_BYTES):
            n = min(CHUNK_BYTES, e.size - offset)
            got = 0
            while f is not None and got < n and (k := f.readinto(view[got:n])):
                got += k
            if got < n:  # unreadable, or shrank since it was hashed: zeros, which the writers' check refuses
                buf[got:n].zero_()
                error = error or f"{folder / e.name} changed while it was being sent"
            dist.broadcast(buf[:n], src=source, group=group)  # every chunk, whatever happened: no writer waits
        if f is not None:
            f.close()
    return error


def _receive(root: Path, step: int, group: object, source: int) -> tuple[str | None, int, int]:
    """A writer's side: stream into tmp-recv-<step>/, verify, mark COMPLETE, rename to step-<step>/.
    Returns (an error or None, files, bytes)."""
    box: list[object] = [None]
    dist.broadcast_object_list(box, src=source, group=group)
    header: dict = box[0]
    if "error" in header:
        return header["error"], 0, 0
    entries: list[FileEntry] = header["entries"]
    tmp, final = root / f"tmp-recv-{step}", root / f"step-{step}"
    error: str | None = None
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    except OSError as exc:
        error = f"cannot create {tmp}: {exc}"
    buf = torch.empty(CHUNK_BYTES, dtype=torch.uint8)
    view = memoryview(buf.numpy())
    for e in entries:
        f = None
        if error is None and not safe_name(e.name):
            error = f"the listing names {e.name!r}, outside the checkpoint folder"
        if error is None:
            try:
                (tmp / e.name).parent.mkdir(parents=True, exist_ok=True)
                f = (tmp / e.name).open("wb")
            except OSError as exc:
                error = f"cannot write {tmp / e.name}: {exc}"
        for offset in range(0, e.size, CHUNK_BYTES):
            n = min(CHUNK_BYTES, e.size - offset)
            dist.broadcast(buf[:n], src=source, group=group)  # received even after an error: the source must not wait
            if f is not None:
                try:
                    f.write(view[:n])
                except OSError as exc:
                    error = f"cannot write {tmp / e.name}: {exc}"
                    f = _close(f)
        if f is not None:
            try:
                f.flush()
                os.fsync(f.fileno())
            except OSError as exc:
                error = f"cannot write {tmp / e.name}: {exc}"
            _close(f)
    if error is None and (problems := verify(tmp, entries)):
        error = f"{len(problems)} of {len(entries)} files differ from the source's: {'; '.join(problems[:3])}"
    if error is None:
        try:
            (tmp / checkpoint.COMPLETE).write_text(header["complete"])
            checkpoint.fsync_tree(tmp)
            if final.exists():  # an unmarked leftover (a complete one would have been reported)
                shutil.rmtree(final)
            tmp.rename(final)
        except OSError as exc:
            error = f"cannot finish {final}: {exc}"
    if error is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    return error, len(entries), sum(e.size for e in entries)


def _close(f: object) -> None:
    """Close `f`, ignoring errors (one is already reported); returns None, the closed handle's new value."""
    try:
        f.close()
    except OSError:
        pass


def share_latest(out: Path, info: DistInfo) -> Path | None:
    """Collective: make the newest complete checkpoint of any rank complete on every rank's
    filesystem (see the module contract) and return its path under `out`; None when no rank has
    one. Raises `TrainSetupError` on every rank when a transfer fails or arrives damaged."""
    mine = checkpoint.latest_checkpoint(out)
    host = socket.gethostname()
    reports = distributed.all_gather_object(info, (mine and int(mine.name[5:]), host, secrets.token_hex(8)))
    steps, hosts = [r[0] for r in reports], [r[1] for r in reports]
    found = newest(steps)
    if found is None:
        return None
    final = out / "checkpoints" / f"step-{found[0]}"
    if all(s == found[0] for s in steps):
        return final
    p = plan(steps, filesystem_ids(out, info, nonce=reports[0][2]))
    assert p is not None
    if not p.writers:
        return final
    started = time.monotonic()
    group = dist.new_group(p.members, backend="gloo")  # every rank calls new_group
    outcome: tuple[str | None, int, int] = (None, 0, 0)
    if info.rank == p.source:
        outcome = (_send(final, group, p.source), 0, 0)
    elif info.rank in p.writers:
        outcome = _receive(out / "checkpoints", p.step, group, p.source)
    if info.rank in p.members:
        dist.destroy_process_group(group)
    results = distributed.all_gather_object(info, (*outcome, time.monotonic() - started))
    failed = [(r, res[0]) for r, res in enumerate(results) if res[0] is not None]
    if failed:
        rank, error = failed[0]
        raise TrainSetupError(f"sharing checkpoint step-{p.step} from rank {p.source} ({hosts[p.source]}) failed on rank "
                              f"{rank} ({hosts[rank]}): {error}; nothing unverified was kept, so a resume tries again")
    _, files, size, _ = results[p.writers[0]]
    receivers = ", ".join(f"rank {r} ({hosts[r]})" for r in p.writers)
    if info.is_main:
        log.info("fanned out checkpoint step-%d from rank %d (%s) to %s: %d files, %s bytes, %.2f s, sizes and sha256 "
                 "verified",
                 p.step, p.source, hosts[p.source], receivers, files, f"{size:,}", max(r[3] for r in results))
    return final

"""Moving a job to another host (``orch resume JOB --on HOST``): the server's side.

Standard library only, Python >= 3.8.

- On the source, ``listing`` names what a move carries: every regular file of the job folder
  (the code snapshot and what the job wrote there, the recorded spec, metrics, logs, outputs)
  with its size, mtime and sha256 — except orch's per-host records (status, manifest, job.json,
  train.json, the Slurm files: the target gets its own) and every checkpoint of the built-in
  trainer but the latest complete one. It also names the inputs the trainer reads from outside
  the job folder (the user must provide those on the target) and the symlinks it leaves out.
- On the target, files arrive in ``jobs/.move-<id>/`` (``have``, ``receive``): each written
  as ``<path>.orch-part`` (a fixed-length ``.orch-tmp-<hex>.orch-part`` where that name would be
  too long) from an offset (a cut transfer continues where it stopped), checked
  against the listing's size and sha256, given the source's mtime, renamed, and written to
  the journal. Nothing unverified stands under a final name.
- ``adopt`` turns a complete staging folder into ``jobs/<id>/`` with the target's own
  job.json and starts it (the caller spawns the supervisor or sbatches); the folder's
  ``moves.json`` keeps the job's history of hosts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from typing import IO, Any, Dict, List, Optional

from remote_payload.contract.jobfolder import (CODE_DIR, SKIP_DIRS, TEMP_PREFIX, atomic_write_json, part_rel, read_json,
                                               sha256_file)
from remote_payload.jobdir import lease
from remote_payload.jobdir.manifest import keep_hashes, known_hashes

STAGE_PREFIX = ".move-"
JOURNAL = ".move-journal"
PART = ".orch-part"
HISTORY = "moves.json"
NOT_CARRIED = ("status.json", "manifest.json", "job.json", "train.json", ".fetched", ".awaiting-fetch", "slurm.sh",
               "slurm.json",
               "cancel.requested")
STALL_S = 120.0
_BAD = re.compile(r"[\x00-\x1f\x7f\\]")
_STEP = re.compile(r"^step-(\d+)$")


class MoveError(Exception):
    """A move step that cannot go on; the message is for the user."""


def latest_checkpoint(job_dir: str) -> Optional[str]:
    """``checkpoints/step-<N>`` of the newest complete checkpoint of the built-in trainer."""
    root = os.path.join(job_dir, "checkpoints")
    steps = []
    for name in os.listdir(root) if os.path.isdir(root) else []:
        m = _STEP.match(name)
        if m and os.path.isfile(os.path.join(root, name, "COMPLETE")):
            steps.append(int(m.group(1)))
    return "checkpoints/step-%d" % max(steps) if steps else None


def listing(job_dir: str) -> Dict[str, Any]:
    """What a move of ``job_dir`` carries (see the module contract)."""
    if not os.path.isdir(job_dir):
        raise MoveError("no such job folder %s" % job_dir)
    cached = known_hashes(job_dir)  # a watched job is listed every round: each file is hashed once
    checkpoint = latest_checkpoint(job_dir)
    files: List[Dict[str, Any]] = []
    links: List[str] = []
    for dirpath, dirnames, filenames in os.walk(job_dir):
        rel_dir = os.path.relpath(dirpath, job_dir).replace(os.sep, "/")
        in_code = rel_dir == CODE_DIR or rel_dir.startswith(CODE_DIR + "/")
        keep = []
        for d in sorted(dirnames):
            rel = d if rel_dir == "." else rel_dir + "/" + d
            if os.path.islink(os.path.join(dirpath, d)):
                links.append(rel)
            elif d.startswith("tmp-") or (in_code and d in SKIP_DIRS) or (rel_dir == "." and d.startswith(".")):
                continue
            elif rel_dir == "checkpoints" and rel != checkpoint:
                continue
            else:
                keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            rel = name if rel_dir == "." else rel_dir + "/" + name
            if (rel_dir == "." and (name in NOT_CARRIED or name.startswith(".")) or name.endswith(PART)
                    or ".tmp." in name or name.startswith(".orch-tmp-")):
                continue
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if os.path.islink(full):
                links.append(rel)
                continue
            if not os.path.isfile(full):
                continue
            old = cached.get(rel)
            same = old and old.get("size") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns
            digest = old["sha256"] if same else sha256_file(full)  # type: ignore[index]
            files.append({"path": rel, "size": st.st_size, "sha256": digest, "mtime_ns": st.st_mtime_ns})
    keep_hashes(job_dir, files)
    return {"files": files, "checkpoint": checkpoint, "links": links, "outside": inputs_outside(job_dir),
            "attempt": int((read_json(os.path.join(job_dir, "status.json")) or {}).get("attempt") or 0)}


def inputs_outside(job_dir: str) -> List[Dict[str, Any]]:
    """The trainer's inputs (model, data) given as absolute paths outside the job folder:
    a move cannot carry them; the user provides them at the same path on the target."""
    train = read_json(os.path.join(job_dir, "train.json"))
    if not isinstance(train, dict):
        return []
    data = train.get("data") if isinstance(train.get("data"), dict) else {}
    named = [("train.model", train.get("model")), ("train.tokenizer", train.get("tokenizer")),
             ("train.data.train", data.get("train")), ("train.data.eval", data.get("eval"))]
    mix = data.get("mix") if isinstance(data.get("mix"), list) else []
    named += [(f"train.data.mix[{i}].{key}", m.get(key)) for i, m in enumerate(mix) if isinstance(m, dict)
              for key in ("train", "eval")]
    out = []
    for field, value in named:
        if isinstance(value, str) and os.path.isabs(value) and not value.startswith(job_dir.rstrip("/") + "/"):
            out.append({"field": field, "path": value, "bytes": _size(value) if os.path.exists(value) else None})
    return out


def _size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    total = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_size
            except OSError:
                pass
    return total


# -- the target --------------------------------------------------------------------------
def stage_dir(root: str, job_id: str) -> str:
    return os.path.join(root, "jobs", STAGE_PREFIX + job_id)


def _journal(stage: str) -> Dict[str, Dict[str, Any]]:
    """Verified files of the staging folder whose file is still there, unchanged."""
    out: Dict[str, Dict[str, Any]] = {}
    try:
        with open(os.path.join(stage, JOURNAL), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            entry = json.loads(line)
            st = os.lstat(os.path.join(stage, entry["path"]))
        except (ValueError, KeyError, TypeError, OSError):
            continue
        if st.st_size == entry.get("size") and st.st_mtime_ns == entry.get("mtime_ns"):
            out[entry["path"]] = entry
    return out


def have(root: str, job_id: str, job_dir: str) -> Dict[str, Any]:
    """What the target holds of a move: ``exists`` (the job is there already), verified
    ``files`` (path -> sha256), ``parts`` (path -> bytes received) and ``free`` bytes."""
    stage = stage_dir(root, job_id)
    parts: Dict[str, int] = {}
    for dirpath, _, names in os.walk(stage):
        for n in names:
            if n.endswith(PART):  # keyed by the file's path; a too-long one by the part's own (``part_rel``)
                rel = os.path.relpath(os.path.join(dirpath, n), stage).replace(os.sep, "/")
                key = rel if n.startswith(TEMP_PREFIX) else rel[:-len(PART)]
                parts[key] = os.lstat(os.path.join(dirpath, n)).st_size
    os.makedirs(os.path.join(root, "jobs"), exist_ok=True)
    vfs = os.statvfs(os.path.join(root, "jobs"))
    return {"exists": os.path.isdir(job_dir), "files": {p: e["sha256"] for p, e in _journal(stage).items()},
            "parts": parts, "free": vfs.f_bavail * vfs.f_frsize}


def _checked_path(rel: Any) -> str:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or _BAD.search(rel) \
            or any(p in ("", ".", "..") for p in rel.split("/")) or rel.endswith(PART) or rel == JOURNAL:
        raise MoveError("refusing the path %r" % (rel,))
    return rel


def _line(inp: IO[bytes]) -> Dict[str, Any]:
    raw = b""
    while not raw.endswith(b"\n"):
        byte = inp.read(1)
        if not byte or len(raw) > 8192:
            raise MoveError("the file stream broke off")
        raw += byte
    value = json.loads(raw.decode("utf-8"))
    if not isinstance(value, dict):
        raise MoveError("the file stream holds an unreadable header")
    return value


def receive(root: str, job_id: str, expected: List[Dict[str, Any]], inp: IO[bytes]) -> Dict[str, Any]:
    """Write the streamed files (``streams.send``'s format: a JSON header line, then its
    bytes; ``{"end": true}`` last) into the staging folder, verified against ``expected``
    (the listing's entries). Returns ``{"written", "bytes"}``."""
    want = {_checked_path(e.get("path")): e for e in expected if isinstance(e, dict)}
    stage = stage_dir(root, job_id)
    os.makedirs(stage, exist_ok=True)
    held = lease.acquire(os.path.join(stage, ".lock"), "move " + job_id, stall_s=STALL_S)
    written = nbytes = 0
    try:
        while True:
            header = _line(inp)
            if header.get("end") is True:
                return {"written": written, "bytes": nbytes}
            rel, offset, size = header.get("path"), header.get("offset"), header.get("size")
            entry = want.get(rel)  # type: ignore[arg-type]
            if entry is None or not isinstance(offset, int) or not isinstance(size, int) or offset < 0 or size < 0:
                raise MoveError("unexpected file header %s" % ascii(header)[:200])
            part = os.path.join(stage, part_rel(rel, PART))
            os.makedirs(os.path.dirname(part), exist_ok=True)
            have_bytes = os.path.getsize(part) if os.path.exists(part) else 0
            if offset > have_bytes:
                raise MoveError("%s: the stream starts at byte %d but only %d are here" % (rel, offset, have_bytes))
            with open(part, "r+b" if os.path.exists(part) else "wb") as f:
                f.truncate(offset)
                f.seek(offset)
                remaining = size
                while remaining:
                    chunk = inp.read(min(remaining, 1 << 20))
                    if not chunk:
                        raise MoveError("%s: the stream ended mid-file" % rel)
                    f.write(chunk)
                    remaining -= len(chunk)
                    held.progress()
            nbytes += size
            if offset + size == entry["size"]:
                _finish_file(stage, rel, part, entry)
                written += 1
    finally:
        held.release()


def _finish_file(stage: str, rel: str, part: str, entry: Dict[str, Any]) -> None:
    digest = sha256_file(part)
    if digest != entry["sha256"]:
        os.unlink(part)
        raise MoveError("%s arrived damaged (sha256 %s..., the source's is %s...); run the move again"
                        % (rel, digest[:12], str(entry["sha256"])[:12]))
    mtime = int(entry.get("mtime_ns") or time.time_ns())
    os.utime(part, ns=(mtime, mtime))
    os.replace(part, os.path.join(stage, rel))
    with open(os.path.join(stage, JOURNAL), "a", encoding="utf-8") as f:
        f.write(json.dumps({"path": rel, "size": entry["size"], "sha256": entry["sha256"], "mtime_ns": mtime}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def adopt(root: str, job_id: str, final: str, expected: List[Dict[str, Any]], job: Dict[str, Any],
          train: Optional[Dict[str, Any]], moved: Dict[str, Any]) -> None:
    """Make the complete staging folder the job folder ``final``: its own job.json (and
    train.json, slurm.sh), a pending status that keeps the attempt count, the move in
    ``moves.json``; then rename it into place. ``MoveError`` when a file is missing."""
    stage = stage_dir(root, job_id)
    verified = _journal(stage)
    missing = [e.get("path") for e in expected if verified.get(e.get("path"), {}).get("sha256") != e.get("sha256")]
    if missing:
        raise MoveError("%d file(s) have not arrived (first: %s); run the move again" % (len(missing), missing[0]))
    wanted = {e.get("path") for e in expected}
    for dirpath, _, names in os.walk(stage):  # what an earlier, different move left here
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), stage).replace(os.sep, "/")
            if rel not in wanted:
                os.unlink(os.path.join(dirpath, n))
    os.makedirs(os.path.join(stage, "logs"), exist_ok=True)
    atomic_write_json(os.path.join(stage, "job.json"), job)
    if train is not None:
        atomic_write_json(os.path.join(stage, "train.json"), train)
    if job.get("slurm"):
        with open(os.path.join(stage, "slurm.sh"), "w", encoding="utf-8") as f:
            f.write(job["slurm"]["script"])
    history = read_json(os.path.join(stage, HISTORY))
    history = history if isinstance(history, list) else []
    history.append(dict(moved, at=time.time()))
    atomic_write_json(os.path.join(stage, HISTORY), history)
    atomic_write_json(os.path.join(stage, "status.json"), {
        "job_id": job_id, "state": "pending", "reason": "moved from %s" % moved.get("from", "?"),
        "attempt": int(moved.get("attempt") or 0), "heartbeat": time.time()})
    os.rename(stage, final)


def discard(root: str, job_id: str) -> None:
    shutil.rmtree(stage_dir(root, job_id), ignore_errors=True)


# -- the old host, after the job moved away -------------------------------------------------
SUPERSEDED_DIR = ".superseded"
SUPERSEDED = "superseded.json"


def set_aside(root: str, job_id: str, job_dir: str, moved_to: str, before: str) -> Optional[str]:
    """A superseded attempt's folder (its processes already stopped) leaves ``jobs/<id>``:
    ``superseded.json`` says where the job went, then the folder is renamed to
    ``jobs/.superseded/<id>-<utc time>`` — a name no request reaches (job ids never start
    with a dot), so nothing ever reads it as the job's again. Returns the new path, or None
    when ``job_dir`` is not there (another orch set it aside first)."""
    if not os.path.isdir(job_dir):
        return None
    atomic_write_json(os.path.join(job_dir, SUPERSEDED), {
        "job_id": job_id, "moved_to": moved_to, "state_before": before, "at": time.time(),
        "note": "orch moved this job to %s; this folder is an earlier attempt, kept for you to read or remove"
                % moved_to})
    aside = os.path.join(root, "jobs", SUPERSEDED_DIR)
    os.makedirs(aside, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    target = os.path.join(aside, "%s-%s" % (job_id, stamp))
    n = 1
    while os.path.exists(target):
        n += 1
        target = os.path.join(aside, "%s-%s-%d" % (job_id, stamp, n))
    try:
        os.rename(job_dir, target)
    except FileNotFoundError:
        return None
    return target

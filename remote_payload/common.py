"""Small standard-library helpers shared by the supervisor and the agent (Python >= 3.8).

Nothing here imports anything outside the standard library: these run before the job's
setup step has installed anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from typing import Any, Dict, Optional

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
CODE_DIR = "code"  # the job's working directory: the workspace snapshot, plus what the job writes there
SNAPSHOT = "snapshot.json"  # what the snapshot held at launch: {"files": {rel: {"size", "mtime_ns"}}}
SKIP_DIRS = ("__pycache__",)  # written by python itself in the working directory, never an output
HASHES = ".hashes.json"  # a cache of sha256 by (path, size, mtime_ns) for live manifests and move listings
NOT_LISTED = ("manifest.json", "status.json", "job.json", ".fetched", HASHES, SNAPSHOT)


def atomic_write_json(path: str, data: Any) -> None:
    """Write JSON so a reader sees the old or the new file, never half of one."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> Optional[Any]:
    """The parsed file, or None when it is missing or not valid JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def known_hashes(job_dir: str) -> Dict[str, Dict[str, Any]]:
    """Hashes a listing may trust while a file's size and mtime are unchanged: manifest.json's
    entries, then the cache's (``keep_hashes``); both untrusted files, odd entries dropped."""
    out: Dict[str, Dict[str, Any]] = {}
    for name in ("manifest.json", HASHES):
        record = read_json(os.path.join(job_dir, name))
        for f in record.get("files", []) if isinstance(record, dict) and isinstance(record.get("files"), list) else []:
            if isinstance(f, dict) and isinstance(f.get("path"), str) and isinstance(f.get("sha256"), str):
                out[f["path"]] = f
    return out


def keep_hashes(job_dir: str, files: "list[Dict[str, Any]]") -> None:
    """Add ``files``' hashes to the cache (entries of files that are gone are dropped); a
    cache: a failure to write is ignored, and of two writers at once the last one wins."""
    path = os.path.join(job_dir, HASHES)
    record = read_json(path)
    old = record.get("files") if isinstance(record, dict) and isinstance(record.get("files"), list) else []
    cache = {f["path"]: f for f in old if isinstance(f, dict) and isinstance(f.get("path"), str)
             and os.path.lexists(os.path.join(job_dir, f["path"]))}
    cache.update((f["path"], f) for f in files)
    try:
        atomic_write_json(path, {"files": sorted(cache.values(), key=lambda f: f["path"])})
    except OSError:
        pass


def boot_id() -> str:
    """This boot of the machine (changes on restart); ``ORCH_BOOT_ID_FILE`` overrides for tests."""
    path = os.environ.get("ORCH_BOOT_ID_FILE", BOOT_ID_FILE)
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def pid_alive(pid: int, needle: str = "") -> bool:
    """True when ``pid`` runs and (if given) its command line contains ``needle``."""
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
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmdline = f.read()
        with open("/proc/%d/stat" % pid, "rb") as f:
            zombie = f.read().rsplit(b")", 1)[-1].split()[0] == b"Z"
    except OSError:
        return False
    return needle.encode() in cmdline and not zombie


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


def file_key(path: str) -> Optional[tuple]:
    """(inode, size, mtime_ns) of ``path``: the same file unchanged while this stays equal; None when missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def build_manifest(job_dir: str, previous: Optional[Dict[str, Any]] = None,
                   settled_before_ns: Optional[int] = None) -> Dict[str, Any]:
    """Every regular file of the job folder except orch's own records and temporaries:
    ``{"files": [{"path", "size", "sha256", "mtime_ns"}]}``, sorted by path.

    ``code/`` (the job's working directory) contributes only what the job wrote there: files
    that are not in the launch snapshot (``snapshot.json``) or that changed since, listed as
    ``code/<path>``; the synced source files never are. A job without a snapshot record
    (older orch) lists nothing of ``code/``.

    A file whose size and mtime equal the previous manifest's keeps its hash unread.
    Symlinks are listed nowhere: fetch never follows a link the server made.
    ``settled_before_ns`` (for a cache of hashes built while the job runs): files modified at
    or after that time are left out, never read — the job may still be writing them.
    """
    known = {f["path"]: f for f in (previous or {}).get("files", []) if isinstance(f, dict)}
    snapshot = read_json(os.path.join(job_dir, SNAPSHOT))
    snap_files = snapshot.get("files") if isinstance(snapshot, dict) else None
    files = []
    for dirpath, dirnames, filenames in os.walk(job_dir):
        rel_dir = os.path.relpath(dirpath, job_dir)
        in_code = rel_dir == CODE_DIR or rel_dir.startswith(CODE_DIR + os.sep)
        if rel_dir == "." and not isinstance(snap_files, dict):
            dirnames[:] = [d for d in dirnames if d != CODE_DIR]
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("tmp-") and not (in_code and d in SKIP_DIRS))
        for name in sorted(filenames):
            rel = name if rel_dir == "." else os.path.join(rel_dir, name)
            if (rel_dir == "." and name in NOT_LISTED) or ".tmp." in name or name.startswith(".orch-tmp-"):
                continue
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if in_code and _from_snapshot(snap_files, rel[len(CODE_DIR) + 1:], st):
                continue
            if settled_before_ns is not None and st.st_mtime_ns >= settled_before_ns:
                continue
            old = known.get(rel)
            if old and old.get("size") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns:
                digest = old["sha256"]
            else:
                try:
                    digest = sha256_file(full)
                except OSError:  # unreadable (a job may chmod its own files): not fetchable, not fatal
                    continue
            files.append({"path": rel, "size": st.st_size, "sha256": digest, "mtime_ns": st.st_mtime_ns})
    return {"files": files, "created": time.time()}


def _from_snapshot(snap_files: Any, rel: str, st: os.stat_result) -> bool:
    """True when ``rel`` under code/ is the synced file as launched (not written by the job)."""
    entry = snap_files.get(rel.replace(os.sep, "/")) if isinstance(snap_files, dict) else None
    return isinstance(entry, dict) and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns


def snapshot_record(code_dir: str, rels: "list[str]") -> Dict[str, Any]:
    """The ``snapshot.json`` document for the files ``rels`` just linked into ``code_dir``."""
    files: Dict[str, Any] = {}
    for rel in rels:
        try:
            st = os.lstat(os.path.join(code_dir, rel))
        except OSError:
            continue
        files[rel] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return {"files": files}

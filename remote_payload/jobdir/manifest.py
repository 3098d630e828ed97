"""A job folder's manifest: what it holds that can be fetched, with size and sha256
(standard library only, Python >= 3.8).

``build_manifest`` lists the folder (of ``code/``, only what the job wrote there);
``known_hashes`` / ``keep_hashes`` let a listing keep the hash of a file whose size and mtime
are unchanged. While a job runs, ``ManifestCache`` builds the manifest in the background (a
duty of ``jobdir/duties.py``), so the one written at the end (before the terminal state)
hashes only what is new or changed since; ``Flock`` serialises ``manifest.json`` writes between supervisors of one job folder (an
earlier attempt's late refresh never crosses a later attempt's final write).
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
from typing import Any, Dict, Optional

from remote_payload.contract.jobfolder import (
    CODE_DIR,
    HASHES,
    NOT_LISTED,
    SKIP_DIRS,
    SNAPSHOT,
    atomic_write_json,
    read_json,
    sha256_file,
)
from remote_payload.jobdir.duties import Duty, Log


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
        atomic_write_json(path, {"files": sorted(cache.values(), key=lambda f: f["path"])}, compact=True)
    except OSError:
        pass


def file_key(path: str) -> Optional[tuple]:
    """(inode, size, mtime_ns) of ``path``: the same file unchanged while this stays equal; None when missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def build_manifest(job_dir: str, previous: Optional[Dict[str, Any]] = None,
                   settled_before_ns: Optional[int] = None) -> Dict[str, Any]:
    """Every regular file of the job folder except orch's own records and temporaries:
    ``{"files": [{"path", "size", "sha256", "mtime_ns"}]}``, sorted by path.

    ``code/`` (the job's working directory) contributes only what the job wrote there: files
    that are not in the launch snapshot (``snapshot.json``) or that changed since, listed as
    ``code/<path>``; the synced source files never are. A job without a snapshot record
    (older orch) lists nothing of ``code/``.

    A file whose size and mtime equal the previous manifest's keeps its hash unread.
    Symlinks are never listed as files: each one (but the synced code's) is described under
    ``"links"`` instead (``describe_link``: where it points and whether that stays inside the
    job folder), so fetch can name it and, asked to, fetch a copy of a target inside the folder
    from the files listed here; nothing is ever read through a link.
    ``settled_before_ns`` (for a cache of hashes built while the job runs): files modified at
    or after that time are left out, never read — the job may still be writing them.
    """
    known = {f["path"]: f for f in (previous or {}).get("files", []) if isinstance(f, dict)}
    snapshot = read_json(os.path.join(job_dir, SNAPSHOT))
    snap_files = snapshot.get("files") if isinstance(snapshot, dict) else None
    files = []
    links = []
    base = os.path.realpath(job_dir)
    for dirpath, dirnames, filenames in os.walk(job_dir):
        rel_dir = os.path.relpath(dirpath, job_dir)
        in_code = rel_dir == CODE_DIR or rel_dir.startswith(CODE_DIR + os.sep)
        if rel_dir == "." and not isinstance(snap_files, dict):
            dirnames[:] = [d for d in dirnames if d != CODE_DIR]
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("tmp-") and not (in_code and d in SKIP_DIRS))
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            rel = name if rel_dir == "." else os.path.join(rel_dir, name)
            if (rel_dir == "." and name in NOT_LISTED) or ".tmp." in name or name.startswith(".orch-tmp-"):
                continue
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if in_code and _from_snapshot(snap_files, rel[len(CODE_DIR) + 1:], st):
                continue
            if stat.S_ISLNK(st.st_mode):
                links.append(describe_link(base, rel))
            if not stat.S_ISREG(st.st_mode):
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
    return {"files": files, "links": sorted(links, key=lambda link: link["path"]), "created": time.time()}


MAX_HOPS = 40  # a chain of links longer than this is a loop (Linux's own limit)


def describe_link(base: str, rel: str) -> Dict[str, Any]:
    """The link ``rel`` of the job folder ``base`` (a real path): ``{"path", "target" (its text),
    "kind", "to"}``. ``kind``: ``file`` or ``dir`` when it resolves, hop by hop, to a regular file
    or a folder inside ``base`` — every hop's path (through ``..`` or an absolute one) and every
    folder on the way stay inside — with ``to`` that target's path in the folder; ``outside`` when
    any hop leaves it; ``dangling`` when the target does not exist; ``loop`` for a folder holding
    the link itself or a chain that never ends; ``other`` for anything else (a fifo, a socket).
    Never opens or reads the target."""
    full = os.path.join(base, rel)
    try:
        target = os.readlink(full)
    except OSError:
        target = ""
    out: Dict[str, Any] = {"path": rel, "target": target[:1024], "kind": "dangling", "to": ""}
    current = full
    for _ in range(MAX_HOPS):
        try:
            text = os.readlink(current)
        except OSError:
            return out
        hop = os.path.normpath(os.path.join(os.path.dirname(current), text))
        parent = os.path.realpath(os.path.dirname(hop))
        if _climbs_out(base, os.path.dirname(current), text) or not _within(base, parent):
            return dict(out, kind="outside")
        current = os.path.join(parent, os.path.basename(hop))
        if os.path.islink(current):
            continue
        try:
            st = os.stat(current)
        except OSError:
            return out  # dangling
        if os.path.realpath(full) != current:  # the system resolves it elsewhere (a link inside the text)
            return dict(out, kind="outside")
        to = os.path.relpath(current, base)
        if stat.S_ISDIR(st.st_mode):
            held = to == "." or rel.startswith(to + os.sep)
            return dict(out, kind="loop" if held else "dir", to="" if held else to)
        return dict(out, kind="file" if stat.S_ISREG(st.st_mode) else "other", to=to)
    return dict(out, kind="loop")


def _within(base: str, path: str) -> bool:
    return path == base or path.startswith(base + os.sep)


def _climbs_out(base: str, start: str, text: str) -> bool:
    """True when the link text ``text``, followed part by part from the folder ``start``, ever
    stands outside ``base`` once inside it (``..`` above it), or never enters it."""
    path = "/" if text.startswith("/") else start
    entered = _within(base, path)
    for part in text.split("/"):
        if part in ("", "."):
            continue
        path = os.path.dirname(path) if part == ".." else os.path.join(path, part)
        if _within(base, path):
            entered = True
        elif entered:
            return True
    return not entered


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


MANIFEST_PACE = 4.0  # the background build pauses at least this many times as long as a build took
SETTLE_S = 2.0  # the background build reads only files unchanged for this long before it began


class ManifestCache:
    """Builds the job folder's manifest in the background while the job runs (the duty
    ``manifest``: ``jobdir/duties.py``, every ``period`` seconds), so the one built at the end
    re-hashes only files that are new or changed since (``build_manifest`` keeps the hash of a
    file whose size and mtime are unchanged). It never writes ``manifest.json``: ``latest`` is
    only a cache of hashes, and it hashes only files that had settled (unmodified for
    ``SETTLE_S``) when the build began — a file the job may still be writing is never read
    here, and is hashed at the end. A build that fails is told to ``log`` (the duties' policy)
    and tried again; ``latest`` stays the newest build that completed."""

    def __init__(self, job_dir: str, period: float, previous: Optional[Dict[str, Any]], log: Log) -> None:
        self.job_dir = job_dir
        self.latest: Optional[Dict[str, Any]] = previous
        self.duty = Duty("manifest", period, self.build, log, pace=MANIFEST_PACE).start()

    def build(self) -> None:
        """One background build, of the files settled when it began."""
        self.latest = build_manifest(self.job_dir, self.latest, int((time.time() - SETTLE_S) * 1e9))

    def stop(self) -> Optional[Dict[str, Any]]:
        """Stop building (a build in progress is not waited for); the newest manifest built."""
        self.duty.stop()
        return self.latest


class Flock:
    """``with Flock(folder):`` holds an exclusive flock on ``folder`` (Linux: a directory
    can be flocked); a folder that cannot be opened is not locked."""

    def __init__(self, folder: str) -> None:
        self.folder, self.fd = folder, -1

    def __enter__(self) -> "Flock":
        try:
            self.fd = os.open(self.folder, os.O_RDONLY)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:
            pass
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing releases the lock

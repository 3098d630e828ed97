"""Server side of sync: the per-project record, and receiving a tar stream of changes.

Record: ``<root>/state/sync-<project>.json`` = {"files": {rel: {size, mtime_ns, mode, link,
sha256 (laptop side), rsize, rmtime_ns (as written here)}}, "generation": random token of this
version, "source": {laptop, path}}. The laptop keeps a copy of the record it last saw
(``orchestrator/sync/record.py``): ``hello`` leaves the files out when the laptop already holds
that generation, and ``receive`` takes the changes since a generation and answers with the
changes it recorded, so neither direction sends the whole record again. Before a receive starts, the
incoming record is journaled as ``sync-<project>.pending.json``, so a file that orch wrote
in a sync that was cut off is not mistaken for an edit made on the server. A receive that
breaks off writes the record of what it completed, with ``partial``: {rel: {size, sha256}}
for a large file cut off under its temporary name, which the next sync continues.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tarfile
import time
from typing import IO, Any, Callable, Collection, Dict, List, Optional, Set, Tuple

from remote_payload.contract.jobfolder import TEMP_PREFIX, atomic_write_json, read_json, sha256_file, temp_name
from remote_payload.contract.protocol import RESUME_MIN_BYTES, ProtocolError
from remote_payload.helper import tarread
from remote_payload.jobdir import lease


class SyncError(Exception):
    pass


def safe_join(base: str, rel: str) -> str:
    if not rel or os.path.isabs(rel) or ".." in rel.split("/") or "\x00" in rel:
        raise SyncError("unsafe path %r" % rel)
    return os.path.join(base, rel)


def _paths(root: str, project: str) -> Dict[str, str]:
    if not project or "/" in project or project.startswith("."):
        raise SyncError("bad project name %r" % project)
    state = os.path.join(root, "state")
    return {"ws": os.path.join(root, "workspace", project),
            "record": os.path.join(state, "sync-%s.json" % project),
            "pending": os.path.join(state, "sync-%s.pending.json" % project)}


def workspace_dir(root: str, project: str) -> str:
    """``<root>/workspace/<project>``; ``SyncError`` for a name that is not one folder."""
    return _paths(root, project)["ws"]


def whole_record(root: str, project: str) -> Dict[str, Any]:
    """The project's record file as it is ({} when there is none): files, generation, partial."""
    return read_json(_paths(root, project)["record"]) or {}


def record_lock(root: str, project: str) -> str:
    """The path of the lease a ``receive`` of ``project`` holds (``jobdir/lease.py``)."""
    return _paths(root, project)["record"] + ".lock"


def record(root: str, project: str) -> Dict[str, Any]:
    return (read_json(_paths(root, project)["record"]) or {"files": {}})["files"]


def sync_state(root: str, project: str, known: Optional[str] = None) -> Dict[str, Any]:
    """The record, plus files edited (content differs from anything orch wrote) or deleted
    on the server since, and the ``partial`` files a cut-off receive kept. Only files whose
    size or mtime changed are hashed. When ``known`` is the record's generation, the files are
    left out (``same: true``): the laptop has them. A receive still writing (an interrupted
    one finishing) is waited for first (``_settled``)."""
    p = _paths(root, project)
    busy = _settled(p["record"] + ".lock")
    whole = read_json(p["record"]) or {}
    files = whole.get("files") or {}
    pending = (read_json(p["pending"]) or {}).get("entries", {})
    edited: List[str] = []
    missing: List[str] = []
    for rel, entry in files.items():
        full = os.path.join(p["ws"], rel)
        try:
            st = os.lstat(full)
        except OSError:
            missing.append(rel)
            continue
        if st.st_size == entry.get("rsize") and st.st_mtime_ns == entry.get("rmtime_ns"):
            continue
        if entry.get("link") is not None:
            ours = os.path.islink(full) and os.readlink(full) in (entry["link"], (pending.get(rel) or {}).get("link"))
        else:
            digest = sha256_file(full) if os.path.isfile(full) else None
            ours = digest is not None and digest in (entry.get("sha256"), (pending.get(rel) or {}).get("sha256"))
        if not ours:
            edited.append(rel)
    out = {"files": files, "edited": sorted(edited), "missing": sorted(missing), "generation": whole.get("generation"),
           "partial": kept_partials(p["ws"], whole.get("partial"))}
    if known is not None and known == whole.get("generation"):
        del out["files"]
        out["same"] = True
    if busy is not None:
        out["lock"] = busy
    return out


SETTLE_S = 15.0  # how long ``sync_state`` waits for a receive that is still writing (an interrupted one finishing)


def _settled(lock: str) -> Optional[Dict[str, Any]]:
    """Wait while another receive of the project holds ``lock`` and makes progress (a sync
    the laptop interrupted writes what was in flight, then records what it kept), at most
    ``SETTLE_S``; then who holds it, or None when it is free."""
    if not os.path.isdir(os.path.dirname(lock)):
        return None
    deadline = time.time() + SETTLE_S
    busy = lease.holder(lock)
    while busy is not None and busy["idle_s"] < 2.5 * lease.PROGRESS_EVERY_S and time.time() < deadline:
        time.sleep(0.1)
        busy = lease.holder(lock)
    return busy


Finish = Callable[[Dict[str, Any], Dict[str, Any], Dict[str, str], Callable[[], None]], Dict[str, Any]]


def receive(root: str, project: str, stream: IO[bytes], stall_s: Optional[float] = None,
            report: Optional[Callable[[Dict[str, Any]], None]] = None,
            finish: Optional[Finish] = None) -> Dict[str, Any]:
    """Read a tar stream: ``.orch-sync.json`` (deletions + the new record) first, then the
    changed files. Each file lands under its temporary name (``jobfolder.temp_name``: fixed
    length, so it fits wherever the file's name fits) and is renamed into place; then
    deletions of recorded files; then the record. ``report`` gets what is kept now and then
    (``_Kept``).

    A stream that breaks off (the laptop interrupted, the link cut) keeps what arrived: the
    files already renamed are recorded, and a file cut off with at least
    ``RESUME_MIN_BYTES`` stays under its temporary name, listed in the record's ``partial``
    (size and sha256 of its bytes), so the next sync sends only the rest. A member carrying
    ``orch.offset`` continues that partial: its bytes on disk are hashed again and must match
    ``orch.prefix``, and the whole must match ``orch.sha256`` before it takes its name;
    otherwise it is discarded and named in ``again`` (the laptop sends it whole). Nothing
    half-written ever stands under a final name.

    ``finish(control, record, received hashes, progress)`` runs last, still under the
    workspace's lease; its answer joins the reply (``stage.finisher``: the submit's code).
    The lease is released however the receive ends (a ``finally``)."""
    p = _paths(root, project)
    os.makedirs(p["ws"], exist_ok=True)
    os.makedirs(os.path.dirname(p["record"]), exist_ok=True)
    try:  # one receive per project at a time; a stalled earlier one is stopped (jobdir/lease.py)
        held = lease.acquire(p["record"] + ".lock", "receive " + project, stall_s)
    except lease.LeaseBusy as exc:
        raise SyncError("another sync of this workspace is running: %s" % exc)
    try:
        return _receive_held(p, held, stream, report, finish)
    finally:
        held.release()


def _receive_held(p: Dict[str, str], held: lease.Lease, stream: IO[bytes],
                  report: Optional[Callable[[Dict[str, Any]], None]], finish: Optional[Finish]) -> Dict[str, Any]:
    """``receive``'s work, while it holds the workspace's lease ``held``."""
    whole = read_json(p["record"]) or {}
    old = whole.get("files") or {}
    partial = kept_partials(p["ws"], whole.get("partial"))
    if held.took_over is not None or os.path.exists(p["pending"]):
        remove_stale_temporaries(p["ws"], keep={_temp_path(p["ws"], rel) for rel in partial})
    control: Optional[Dict[str, Any]] = None
    received: Dict[str, str] = {}
    landed: Dict[str, os.stat_result] = {}  # each received file as written (the record's rsize, rmtime_ns)
    again: List[str] = []
    kept = _Kept(report)
    written = nbytes = 0
    current: Optional[_Copy] = None
    tmp: Optional[str] = None  # a temporary not yet renamed into place
    ready: Set[str] = set()  # folders (relative) made real folders by this receive (``clear_way``)
    try:
        tar = tarread.Reader(stream)
        for member in tar:
            if control is None:
                if member.name != ".orch-sync.json":
                    raise SyncError("sync stream must start with .orch-sync.json")
                control = json.loads(tar.read().decode("utf-8"))
                atomic_write_json(p["pending"], {"entries": control.get("changed", control.get("entries"))},
                                  compact=True)
                control["entries"] = _entries(control, old)
                continue
            dest = safe_join(p["ws"], member.name)
            folder = os.path.dirname(member.name)
            if folder not in ready:  # once per folder and receive: the lease keeps other syncs out
                clear_way(p["ws"], member.name, old)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                ready.add(folder)
            tmp = _temp_of(dest)
            if member.issym():
                if os.path.lexists(tmp):
                    os.unlink(tmp)
                os.symlink(member.linkname, tmp)
            elif member.isfile():
                current = _Copy(member.name, tmp, _resume_from(tmp, member, partial.pop(member.name, None)))
                current.run(tar, member.size, member.mode & 0o700, held.progress, kept)
                copy, current = current, None
                if not copy.matches(member.pax_headers.get("orch.sha256")):
                    os.unlink(tmp)
                    tmp = None
                    again.append(member.name)
                    continue
                received[member.name] = copy.hexdigest()
                landed[member.name] = copy.stat
                nbytes += member.size
            else:
                tmp = None
                continue
            if _real_folder(dest):
                remove_synced_folder(p["ws"], member.name, old)
            os.replace(tmp, dest)
            tmp = None
            written += 1
            kept.done(member.name)
    except BaseException as exc:
        cut = isinstance(exc, (tarfile.TarError, EOFError, ProtocolError, KeyboardInterrupt))
        if current is not None:
            partial.update(current.keep() if cut else current.discard())
        elif tmp is not None:
            _unlink_quietly(tmp)
        if control is not None:
            arrived = {rel: dict(control["entries"].get(rel) or {}, sha256=digest) for rel, digest in received.items()}
            _record_cut(p, whole, old, arrived, partial)
        if isinstance(exc, (tarfile.TarError, EOFError)):
            raise SyncError("the sync stream broke off: %s" % exc)
        raise
    if control is None:
        raise SyncError("empty sync stream")
    for rel in partial:  # kept for a sync that no longer wants them
        _unlink_quietly(_temp_path(p["ws"], rel))
    deleted = 0
    for rel in control["delete"]:
        if rel in old and rel not in control["entries"]:
            try:
                os.unlink(safe_join(p["ws"], rel))
                deleted += 1
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                pass  # gone; or a folder above it became a file; or it became a folder the laptop sent
    files = {}
    for rel, entry in control["entries"].items():
        if rel in received:  # the hash of what arrived, which the laptop's may not be if it changed meanwhile
            entry = dict(entry, sha256=received[rel])
        elif entry.get("link") is None and (old.get(rel) or {}).get("sha256") != entry.get("sha256"):
            entry = old.get(rel)  # announced but not sent (it vanished on the laptop): the copy here is the old one
        if entry is None:
            continue
        st = landed.get(rel)
        if st is None:
            try:
                st = os.lstat(safe_join(p["ws"], rel))
            except OSError:
                continue  # not here: the record never lists a file it does not have
        files[rel] = dict(entry, rsize=st.st_size, rmtime_ns=st.st_mtime_ns)
    source = control.get("source") if isinstance(control.get("source"), dict) else {}
    generation = os.urandom(8).hex()
    atomic_write_json(p["record"], {"files": files, "source": {k: str(v)[:300] for k, v in source.items()},
                                    "generation": generation}, compact=True)
    os.unlink(p["pending"])
    out = {"written": written, "deleted": deleted, "bytes": nbytes, "workspace": p["ws"], "generation": generation}
    if finish is not None:
        out.update(finish(control, files, received, held.progress))
    if control.get("base") is not None and control["base"] == (whole.get("generation") or ""):  # the laptop holds ``old``
        out["changes"] = {rel: files.get(rel) for rel in set(old) | set(files) if old.get(rel) != files.get(rel)}
    if again:
        out["again"] = again
    return out


def _temp_path(ws: str, rel: str) -> str:
    """Where ``rel`` is written before it takes its name (``jobfolder.temp_name``)."""
    return _temp_of(safe_join(ws, rel))


def _temp_of(dest: str) -> str:
    folder, name = os.path.split(dest)
    return os.path.join(folder, temp_name(name))


def _real_folder(path: str) -> bool:
    """A folder, not a symlink to one (one ``lstat``)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class _Kept:
    """What the receive holds so far, told to ``report`` at most every ``EVERY_S``:
    ``files`` renamed into place, ``bytes`` written, and the file being written with the
    bytes of it on disk (``file``, ``have``)."""

    EVERY_S = 0.2

    def __init__(self, report: Optional[Callable[[Dict[str, Any]], None]]) -> None:
        self.report, self.last = report, 0.0
        self.state: Dict[str, Any] = {"files": 0, "bytes": 0, "file": None, "have": 0}

    def wrote(self, rel: str, have: int, more: int) -> None:
        self.state.update(file=rel, have=have, bytes=self.state["bytes"] + more)
        self._tell(False)

    def done(self, rel: str) -> None:
        self.state.update(files=self.state["files"] + 1, file=None, have=0)
        self._tell(False)

    def _tell(self, now: bool) -> None:
        if self.report is None or not (now or time.time() - self.last >= self.EVERY_S):
            return
        self.last = time.time()
        self.report(dict(self.state))


class _Copy:
    """One file's bytes into its temporary, hashed as written; ``resume`` is a verified
    partial already there (its size and running sha256) or None. A new temporary is created
    afresh (``O_EXCL``: whatever stood under its name, a symlink included, is removed first,
    never written through); ``stat`` is the file as written, for the record."""

    BLOCK = 1 << 20

    def __init__(self, rel: str, tmp: str, resume: "Optional[Tuple[int, Any]]") -> None:
        self.rel, self.tmp = rel, tmp
        self.size, self.hash = resume if resume is not None else (0, hashlib.sha256())
        self.stat: Optional[os.stat_result] = None

    def run(self, src: tarread.Reader, size: int, mode: int, progress: Callable[[], None], kept: _Kept) -> None:
        """Write ``size`` bytes of ``src`` (after the partial's); the file gets ``mode``."""
        fd = self._open()
        try:
            left = size
            while left:
                block = src.read(min(left, self.BLOCK))
                if not block:
                    break
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view):]
                self.hash.update(block)  # after the write: a failed write is never counted
                self.size += len(block)
                left -= len(block)
                progress()
                kept.wrote(self.rel, self.size, len(block))
            os.fchmod(fd, mode)  # its owner's bits only: jobdir/private.py
            self.stat = os.fstat(fd)
        finally:
            os.close(fd)

    def _open(self) -> int:
        if self.size:  # the verified partial continues
            fd = os.open(self.tmp, os.O_WRONLY | os.O_NOFOLLOW)
            os.lseek(fd, self.size, os.SEEK_SET)
            return fd
        try:
            return os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            os.unlink(self.tmp)
            return os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)

    def matches(self, want: Optional[str]) -> bool:
        return want is None or self.hash.hexdigest() == want

    def hexdigest(self) -> str:
        return self.hash.hexdigest()

    def keep(self) -> Dict[str, Dict[str, Any]]:
        """A cut-off file: kept as a partial when it is large enough (its file is closed, so
        every counted byte is on disk), else removed."""
        try:
            if self.size >= RESUME_MIN_BYTES and os.path.getsize(self.tmp) == self.size:
                return {self.rel: {"size": self.size, "sha256": self.hash.hexdigest()}}
        except OSError:
            pass
        return self.discard()

    def discard(self) -> Dict[str, Dict[str, Any]]:
        _unlink_quietly(self.tmp)
        return {}


def _resume_from(tmp: str, member: tarread.Member, known: Optional[Dict[str, Any]]) -> "Optional[Tuple[int, Any]]":
    """(size, sha256 object) of the partial ``member`` continues, read back from disk and
    checked against the record (``known``) and the laptop's ``orch.prefix``; None when the
    member starts from byte 0. ``SyncError`` never: a partial that does not match is removed
    and the member's bytes are taken as a new file's (``matches`` then fails on its sha256)."""
    raw = member.pax_headers.get("orch.offset")
    if raw is None:
        return None
    h = hashlib.sha256()
    try:
        offset = int(raw)
        with open(tmp, "rb") as f:
            remaining = offset
            while remaining:
                block = f.read(min(remaining, 1 << 20))
                if not block:
                    break
                h.update(block)
                remaining -= len(block)
        good = (known is not None and remaining == 0 and known.get("size") == offset and os.path.getsize(tmp) == offset
                and h.hexdigest() == known.get("sha256") == member.pax_headers.get("orch.prefix"))
    except (OSError, ValueError):
        good = False
    if good:
        return offset, h
    _unlink_quietly(tmp)
    return None


def kept_partials(ws: str, partial: Any) -> Dict[str, Dict[str, Any]]:
    """The record's ``partial`` entries whose temporary is still there with their size."""
    out: Dict[str, Dict[str, Any]] = {}
    for rel, entry in (partial.items() if isinstance(partial, dict) else []):
        try:
            if isinstance(entry, dict) and os.path.getsize(_temp_path(ws, rel)) == entry.get("size"):
                out[rel] = {"size": int(entry["size"]), "sha256": str(entry.get("sha256"))}
        except (OSError, SyncError, TypeError, ValueError):
            continue
    return out


def _record_cut(p: Dict[str, str], whole: Dict[str, Any], old: Dict[str, Any], arrived: Dict[str, Any],
                partial: Dict[str, Dict[str, Any]]) -> None:
    """After a receive that did not finish: the record holds the old entries still true on
    disk, the files this receive renamed into place (with the hash of what arrived) and the
    kept partials; then the journal goes (nothing it names is mistaken for a server edit:
    whatever this receive wrote is recorded). Best effort: when it cannot be written (a full
    disk) the journal stays and the next receive cleans up as before."""
    files: Dict[str, Any] = {}
    for rel, entry in list(old.items()) + list(arrived.items()):
        try:
            st = os.lstat(safe_join(p["ws"], rel))
        except (OSError, SyncError):
            continue
        if stat.S_ISLNK(st.st_mode) != (entry.get("link") is not None) or stat.S_ISDIR(st.st_mode):
            continue
        files[rel] = dict(entry, rsize=st.st_size, rmtime_ns=st.st_mtime_ns)
    try:
        atomic_write_json(p["record"], {"files": files, "generation": os.urandom(8).hex(), "partial": partial,
                                        "source": whole.get("source") or {}}, compact=True)
        os.unlink(p["pending"])
    except OSError:
        pass


def _entries(control: Dict[str, Any], old: Dict[str, Any]) -> Dict[str, Any]:
    """The laptop's whole selection: ``entries`` as sent, or the record here with the
    ``changed`` entries put in and the ``delete``d ones taken out (applied to the record as it
    is now, even if another sync moved it past the laptop's ``base``: each file's entry is
    written together with the file, so the record stays true to what is on disk)."""
    if "changed" not in control:
        return control["entries"]
    gone = set(control["delete"])
    entries = {rel: entry for rel, entry in old.items() if rel not in gone}
    entries.update(control["changed"])
    return entries


def remove_stale_temporaries(ws: str, keep: Collection[str] = ()) -> None:
    """Remove the temporaries (``.orch-tmp-*``) that a cut-off or stopped receive left, but
    the partials in ``keep`` (the caller holds the project's lease, so no live receive owns
    any)."""
    for dirpath, _, filenames in os.walk(ws):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if name.startswith(TEMP_PREFIX) and path not in keep:
                _unlink_quietly(path)


def clear_way(ws: str, rel: str, old: Dict[str, Any]) -> None:
    """Make every folder above ``rel`` a real folder: a file or symlink standing where the
    laptop now has a folder is removed when orch synced it (it is in ``old``), so type
    changes (file -> folder, symlink -> folder) sync; one orch did not sync is an error.
    Nothing is ever written through a symlink."""
    parts = rel.split("/")[:-1]
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        full = os.path.join(ws, prefix)
        if not os.path.lexists(full) or (os.path.isdir(full) and not os.path.islink(full)):
            continue
        if prefix not in old:
            raise SyncError("%s is a %s on the server that orch did not sync, where the laptop has a folder: "
                            "move it away on the server (orch exec HOST -- mv ...) and submit again"
                            % (prefix, "symlink" if os.path.islink(full) else "file"))
        os.unlink(full)


def remove_synced_folder(ws: str, rel: str, old: Dict[str, Any]) -> None:
    """Remove folder ``rel`` that the laptop now has as a file or symlink: the files orch
    synced under it, then the emptied folders. A file orch did not sync (made on the
    server) stops the sync instead of being deleted."""
    top = os.path.join(ws, rel)
    for name in old:
        if name.startswith(rel + "/"):
            try:
                os.unlink(os.path.join(ws, name))
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                pass
    for dirpath, dirnames, filenames in os.walk(top, topdown=False):
        if filenames or any(os.path.islink(os.path.join(dirpath, d)) for d in dirnames):
            left = os.path.relpath(os.path.join(dirpath, (filenames or dirnames)[0]), ws)
            raise SyncError("%s is a folder on the server holding files orch did not sync (e.g. %s), where the laptop "
                            "has a file: move them away on the server and submit again" % (rel, left))
        os.rmdir(dirpath)


def tree_files(top: str) -> List[str]:
    """Every file and symlink (to a file or a folder) under ``top``, as sorted relative
    paths; none for a missing ``top``."""
    out: List[str] = []
    for dirpath, dirnames, filenames in os.walk(top):
        rel_dir = os.path.relpath(dirpath, top)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            out.append(name if rel_dir == "." else os.path.join(rel_dir, name))
    return sorted(out)


def link_tree(src: str, dst: str, only: "Optional[Collection[str]]" = None) -> List[str]:
    """Hard-link the files of ``src`` into ``dst`` (symlinks, to files or folders, copied as
    links); ``only`` limits it to those relative paths. A missing ``src`` links nothing.
    Returns the relative paths linked."""
    linked: List[str] = []
    for rel in tree_files(src):
        if only is not None and rel not in only:
            continue
        source, target = os.path.join(src, rel), os.path.join(dst, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.islink(source):
            os.symlink(os.readlink(source), target)
        else:
            os.link(source, target)
        linked.append(rel)
    return linked


def list_workspaces(root: str, limit: int = 50) -> List[Dict[str, Any]]:
    """The workspaces on this host, newest sync first: name, file count, bytes, when last
    synced, and where from (laptop and path, as the laptop reported them)."""
    state = os.path.join(root, "state")
    out: List[Dict[str, Any]] = []
    try:
        names = [n for n in os.listdir(state) if n.startswith("sync-") and n.endswith(".json")
                 and not n.endswith(".pending.json")]
    except OSError:
        return out
    for name in names:
        path = os.path.join(state, name)
        try:
            synced = os.stat(path).st_mtime
        except OSError:
            continue
        doc = read_json(path)
        if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict):
            continue
        files = doc["files"]
        source = doc.get("source") if isinstance(doc.get("source"), dict) else {}
        out.append({"name": name[len("sync-"):-len(".json")], "files": len(files), "synced": synced,
                    "bytes": sum(int(f.get("size") or 0) for f in files.values() if isinstance(f, dict)),
                    "laptop": str(source.get("laptop") or "?"), "path": str(source.get("path") or "?")})
    out.sort(key=lambda w: -w["synced"])
    return out[:limit]


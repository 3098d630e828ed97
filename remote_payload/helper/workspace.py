"""Server side of sync: the per-project record, and receiving a tar stream of changes.

Record: ``<root>/state/sync-<project>.json`` = {"files": {rel: {size, mtime_ns, mode, link,
sha256 (laptop side), rsize, rmtime_ns (as written here)}}, "generation": random token of this
version, "source": {laptop, path}}. The laptop keeps a copy of the record it last saw
(``orchestrator/sync/record.py``): ``hello`` leaves the files out when the laptop already holds
that generation, and ``receive`` takes the changes since a generation and answers with the
changes it recorded, so neither direction sends the whole record again. Before a receive starts, the
incoming record is journaled as ``sync-<project>.pending.json``, so a file that orch wrote
in a sync that was cut off is not mistaken for an edit made on the server.
"""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from typing import IO, Any, Callable, Collection, Dict, List, Optional

from remote_payload.contract.jobfolder import atomic_write_json, read_json, sha256_file
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


def record(root: str, project: str) -> Dict[str, Any]:
    return (read_json(_paths(root, project)["record"]) or {"files": {}})["files"]


def sync_state(root: str, project: str, known: Optional[str] = None) -> Dict[str, Any]:
    """The record, plus files edited (content differs from anything orch wrote) or deleted
    on the server since. Only files whose size or mtime changed are hashed. When ``known`` is
    the record's generation, the files are left out (``same: true``): the laptop has them."""
    p = _paths(root, project)
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
    out = {"files": files, "edited": sorted(edited), "missing": sorted(missing), "generation": whole.get("generation")}
    if known is not None and known == whole.get("generation"):
        del out["files"]
        out["same"] = True
    busy = lease.holder(p["record"] + ".lock") if os.path.isdir(os.path.dirname(p["record"])) else None
    if busy is not None:
        out["lock"] = busy
    return out


def receive(root: str, project: str, stream: IO[bytes], stall_s: float = lease.STALL_S) -> Dict[str, Any]:
    """Read a tar stream: ``.orch-sync.json`` (deletions + the new record) first, then the
    changed files. Each file lands as ``.orch-tmp-<pid>-<name>`` and is renamed into place (a
    broken stream leaves no temporary behind); then deletions of recorded files; then the
    record."""
    p = _paths(root, project)
    os.makedirs(p["ws"], exist_ok=True)
    os.makedirs(os.path.dirname(p["record"]), exist_ok=True)
    try:  # one receive per project at a time; a stalled earlier one is stopped (jobdir/lease.py)
        held = lease.acquire(p["record"] + ".lock", "receive " + project, stall_s)
    except lease.LeaseBusy as exc:
        raise SyncError("another sync of this workspace is running: %s" % exc)
    if held.took_over is not None or os.path.exists(p["pending"]):
        remove_stale_temporaries(p["ws"])  # an earlier receive was cut off or stopped
    whole = read_json(p["record"]) or {}
    old = whole.get("files") or {}
    control: Optional[Dict[str, Any]] = None
    received: Dict[str, str] = {}
    written = nbytes = 0
    tmp = None
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                if control is None:
                    if member.name != ".orch-sync.json":
                        raise SyncError("sync stream must start with .orch-sync.json")
                    control = json.loads(tar.extractfile(member).read().decode("utf-8"))
                    atomic_write_json(p["pending"], {"entries": control.get("changed", control.get("entries"))})
                    control["entries"] = _entries(control, old)
                    continue
                dest = safe_join(p["ws"], member.name)
                clear_way(p["ws"], member.name, old)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                tmp = os.path.join(os.path.dirname(dest), ".orch-tmp-%d-%s" % (os.getpid(), os.path.basename(dest)))
                if os.path.lexists(tmp):
                    os.unlink(tmp)
                if member.issym():
                    os.symlink(member.linkname, tmp)
                elif member.isfile():
                    received[member.name] = _copy_hashing(tar.extractfile(member), tmp, held.progress)
                    os.chmod(tmp, member.mode & 0o700)  # its owner's bits only: jobdir/private.py
                    nbytes += member.size
                else:
                    continue
                if os.path.isdir(dest) and not os.path.islink(dest):
                    remove_synced_folder(p["ws"], member.name, old)
                os.replace(tmp, dest)
                tmp = None
                written += 1
    except (tarfile.TarError, EOFError) as exc:
        raise SyncError("the sync stream broke off: %s" % exc)
    finally:
        if tmp is not None and os.path.lexists(tmp):
            os.unlink(tmp)
    if control is None:
        raise SyncError("empty sync stream")
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
        try:
            st = os.lstat(safe_join(p["ws"], rel))
        except OSError:
            continue  # not here: the record never lists a file it does not have
        files[rel] = dict(entry, rsize=st.st_size, rmtime_ns=st.st_mtime_ns)
    source = control.get("source") if isinstance(control.get("source"), dict) else {}
    generation = os.urandom(8).hex()
    atomic_write_json(p["record"], {"files": files, "source": {k: str(v)[:300] for k, v in source.items()},
                                    "generation": generation})
    os.unlink(p["pending"])
    out = {"written": written, "deleted": deleted, "bytes": nbytes, "workspace": p["ws"], "generation": generation}
    if control.get("base") is not None and control["base"] == (whole.get("generation") or ""):  # the laptop holds ``old``
        out["changes"] = {rel: files.get(rel) for rel in set(old) | set(files) if old.get(rel) != files.get(rel)}
    return out


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


def _copy_hashing(src: IO[bytes], dest: str, progress: Callable[[], None]) -> str:
    h = hashlib.sha256()
    with open(dest, "wb") as f:
        while True:
            block = src.read(1 << 16)
            if not block:
                break
            h.update(block)
            f.write(block)
            progress()
    return h.hexdigest()


def remove_stale_temporaries(ws: str) -> None:
    """Remove ``.orch-tmp-*`` files that a cut-off or stopped receive left (the caller holds
    the project's lease, so no live receive owns any)."""
    for dirpath, _, filenames in os.walk(ws):
        for name in filenames:
            if name.startswith(".orch-tmp-"):
                try:
                    os.unlink(os.path.join(dirpath, name))
                except OSError:
                    pass


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


def snapshot(root: str, project: str, code_dir: str) -> List[str]:
    """Hard-link every recorded file of the workspace into ``code_dir`` (symlinks copied);
    return their relative paths."""
    ws = _paths(root, project)["ws"]
    files = record(root, project)
    os.makedirs(code_dir, exist_ok=True)
    for rel in files:
        src, dst = safe_join(ws, rel), safe_join(code_dir, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        else:
            os.link(src, dst)
    return sorted(files)


def link_tree(src: str, dst: str, only: "Optional[Collection[str]]" = None) -> List[str]:
    """Hard-link the files of ``src`` into ``dst`` (symlinks copied as links); ``only``
    limits it to those relative paths. A missing ``src`` links nothing. Returns the
    relative paths linked."""
    linked: List[str] = []
    for dirpath, _, filenames in os.walk(src):
        rel_dir = os.path.relpath(dirpath, src)
        for name in filenames:
            rel = name if rel_dir == "." else os.path.join(rel_dir, name)
            if only is not None and rel not in only:
                continue
            source, target = os.path.join(dirpath, name), os.path.join(dst, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.islink(source):
                os.symlink(os.readlink(source), target)
            else:
                os.link(source, target)
            linked.append(rel)
    return sorted(linked)


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


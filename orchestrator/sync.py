"""Workspace sync: choose files, diff against what the host recorded, send one tar stream.

Promises: ``.git/`` is never sent; files are chosen with gitignore semantics from the
workspace's ``.gitignore``, ``.orchignore`` and ``workspace.exclude``, in that order; only
changed files move (a second sync with no change sends no file data); each file lands under
a temporary name and is renamed into place; a file deleted locally is deleted remotely only
if orch synced it earlier; a file edited on the server since the last sync is never
overwritten unless ``force``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pathspec

from orchestrator import runs
from orchestrator.errors import RemoteError, UsageError
from orchestrator.remote import FileStream, Remote
from orchestrator.transport.base import Process

SECRET_RE = re.compile(r"^(\.env(\..*)?|.*\.pem|.*\.key|id_(rsa|dsa|ecdsa|ed25519)|\.netrc|\.pypirc|credentials(\.json)?|.*\.p12)$")
LARGE_WORKSPACE_BYTES = int(os.environ.get("ORCH_LARGE_WORKSPACE_MB", "500")) << 20


@dataclass(frozen=True)
class LocalFile:
    rel: str
    size: int
    mtime_ns: int
    mode: int
    link: str | None = None


@dataclass
class SyncPlan:
    send: list[str] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    send_bytes: int = 0
    noop: bool = False  # nothing to send, delete or re-record: no round trip needed


def project_name(workspace: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "-", workspace.name).strip(".-")
    return name or "workspace"


def ignore_spec(root: Path, exclude: list[str]) -> pathspec.PathSpec:
    lines: list[str] = []
    for name in (".gitignore", ".orchignore"):
        path = root / name
        if path.is_file():
            lines += path.read_text(encoding="utf-8", errors="replace").splitlines()
    return pathspec.GitIgnoreSpec.from_lines(lines + list(exclude))


def select_files(root: Path, exclude: list[str], orch_dirs: list[str] | None = None) -> dict[str, LocalFile]:
    """The workspace files to sync, by POSIX relative path. Never ``.git/``, never a folder
    orch wrote itself (``runs.MARKER`` inside: fetched jobs, plots) — those folders are
    appended to ``orch_dirs`` when it is given — and never orch's own temporaries."""
    if not root.is_dir():
        raise UsageError(f"workspace {root} is not a folder")
    spec = ignore_spec(root, exclude)
    out: dict[str, LocalFile] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        kept = []
        for d in sorted(dirnames):
            if d == ".git" or spec.match_file(prefix + d + "/"):
                continue
            if runs.is_run_dir(Path(dirpath, d)):
                if orch_dirs is not None:
                    orch_dirs.append(prefix + d + "/")
                continue
            kept.append(d)
        dirnames[:] = kept
        for name in sorted(filenames):
            rel = prefix + name
            if name.startswith(".orch-pull-") or spec.match_file(rel):
                continue
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = LocalFile(rel, 0, st.st_mtime_ns, 0o777, os.readlink(os.path.join(dirpath, name)))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = LocalFile(rel, st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
    return out


def warnings_for(files: dict[str, LocalFile]) -> list[str]:
    """Likely secrets and a too-large workspace, each with a hint."""
    out = []
    secrets = [rel for rel in files if SECRET_RE.match(rel.rsplit("/", 1)[-1])]
    if secrets:
        out.append(f"these look like secrets and will be sent: {', '.join(secrets[:8])}"
                   " (add them to .orchignore to keep them on the laptop)")
    total = sum(f.size for f in files.values())
    if total > LARGE_WORKSPACE_BYTES:
        big = sorted(files.values(), key=lambda f: -f.size)[:3]
        out.append(f"the workspace is {total / 2**20:.0f} MB; largest: "
                   + ", ".join(f"{f.rel} ({f.size / 2**20:.0f} MB)" for f in big)
                   + " — ignore data and checkpoints in .orchignore")
    return out


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def plan_sync(root: Path, files: dict[str, LocalFile], remote: dict[str, Any], force: bool,
              pulled: frozenset[str] = frozenset()) -> SyncPlan:
    """Decide what to send and delete from local stats and the host's record. Files edited
    on the server are refused unless ``force``, or unless they were just ``pulled`` (then the
    laptop's copy is the server's)."""
    recorded: dict[str, Any] = remote.get("files", {})
    edited = set(remote.get("edited", []))
    plan = SyncPlan()
    for rel, f in files.items():
        rec = recorded.get(rel)
        entry = {"size": f.size, "mtime_ns": f.mtime_ns, "mode": f.mode, "link": f.link}
        same_stat = rec is not None and all(rec.get(k) == entry[k] for k in entry)
        if same_stat:
            entry["sha256"] = rec.get("sha256")
        else:
            entry["sha256"] = None if f.link is not None else sha256_of(root / rel)
        unchanged = rec is not None and rec.get("sha256") == entry["sha256"] and rec.get("mode") == f.mode \
            and rec.get("link") == f.link
        plan.entries[rel] = entry
        if unchanged and rel not in remote.get("missing", []) and (rel not in edited or not force):
            continue
        plan.send.append(rel)
        plan.send_bytes += f.size
    plan.delete = sorted(rel for rel in recorded if rel not in files)
    plan.noop = not plan.send and not plan.delete and all(
        {k: v for k, v in recorded[rel].items() if k not in ("rsize", "rmtime_ns")} == entry
        for rel, entry in plan.entries.items()
    )
    clobber = sorted(edited - pulled) if not force else []
    if clobber:
        raise UsageError(
            "these files were changed on the server since the last sync (the laptop's copy would replace them): "
            + ", ".join(clobber[:20]) + ("" if len(clobber) <= 20 else f" (+{len(clobber) - 20} more)")
            + "\nBring them to the laptop with --pull-remote-edits, or pass --force to overwrite them."
        )
    return plan


class _ProcessWriter(io.RawIOBase):
    def __init__(self, proc: Process) -> None:
        self.proc = proc

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.proc.write(bytes(data))
        return len(data)


def send(remote: Remote, project: str, root: Path, plan: SyncPlan,
         progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Stream the plan's files as one tar to ``agent receive``; return its summary."""
    if plan.noop:
        return {"written": 0, "deleted": 0, "bytes": 0}
    proc = remote.start("receive", project)
    error: list[BaseException] = []

    def produce() -> None:
        try:
            with tarfile.open(fileobj=_ProcessWriter(proc), mode="w|", bufsize=1 << 18) as tar:
                control = json.dumps({"delete": plan.delete, "entries": plan.entries}).encode()
                info = tarfile.TarInfo(".orch-sync.json")
                info.size = len(control)
                tar.addfile(info, io.BytesIO(control))
                for rel in plan.send:
                    entry = plan.entries[rel]
                    info = tarfile.TarInfo(rel)
                    if entry["link"] is not None:
                        info.type, info.linkname = tarfile.SYMTYPE, entry["link"]
                        tar.addfile(info)
                        continue
                    with open(root / rel, "rb") as f:
                        size = os.fstat(f.fileno()).st_size
                        info.size, info.mode = size, entry["mode"]
                        tar.addfile(info, f)
                    if progress:
                        progress(size)
            proc.close_stdin()
        except BaseException as exc:  # reported by the caller after the remote side ends
            error.append(exc)
            proc.kill()

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    try:
        value = remote.finish(proc, "sync")
    finally:
        writer.join()
    if error:
        raise error[0]
    return value


def sync(remote: Remote, root: Path, exclude: list[str], state: dict[str, Any], force: bool = False) -> tuple[SyncPlan, dict[str, Any]]:
    """Sync ``root`` to the host's workspace for its project; ``state`` is hello's ``sync``."""
    files = select_files(root, exclude)
    plan = plan_sync(root, files, state, force)
    summary = send(remote, project_name(root), root, plan)
    return plan, summary


def pull(remote: Remote, project: str, root: Path, paths: list[str]) -> list[str]:
    """Copy ``paths`` (files orch synced, since edited on the server) from the host's
    workspace into the local one, each written to a temporary and renamed into place."""
    requests = [{"path": p, "offset": 0} for p in paths]
    proc = remote.start("send-ws", project)
    proc.write(json.dumps(requests).encode())
    proc.close_stdin()
    stream = FileStream(proc)
    base = os.path.realpath(root)
    for req in requests:
        header = stream.header()
        size = header.get("size")
        target = os.path.realpath(os.path.join(base, req["path"]))
        if header.get("path") != req["path"] or not isinstance(size, int) or size < 0 \
                or not target.startswith(base + os.sep):
            raise RemoteError(f"{remote.host.name}: unexpected file header {ascii(header)[:200]}")
        tmp = Path(target).with_name(f".orch-pull-{os.getpid()}-{Path(target).name}")
        with open(tmp, "wb") as f:
            remaining = size
            while remaining:
                data = stream.take(min(remaining, 1 << 20))
                f.write(data)
                remaining -= len(data)
        os.replace(tmp, target)
    if stream.header() != {"end": True}:
        raise RemoteError(f"{remote.host.name}: the file stream did not end cleanly")
    proc.wait()
    return paths

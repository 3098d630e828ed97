"""A server's manifest as ``orch fetch`` reads it: untrusted entries checked (``safe_entries``)
and named under ``DEST/<job_id>/`` (``local_names``); its symlinks, described by the server,
checked (``safe_links``), and the files a copy of one whose target stays inside the job folder
is made of (``copies``)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import RemoteError

SHA_RE = re.compile(r"^[0-9a-f]{64}$")
BAD_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")
MAX_FILES = 100_000


CODE_PREFIX = "code/"  # the job's working directory on the server; its manifest entries are what the job wrote


@dataclass(frozen=True)
class Entry:
    """One manifest file: ``path`` in the job folder on the server, ``local`` under DEST/<job_id>/."""

    path: str
    size: int
    sha256: str
    local: str = ""


@dataclass(frozen=True)
class Link:
    """A symlink of the job folder as the server described it (``jobdir/manifest.describe_link``):
    ``path`` in the folder, ``target`` its text, ``kind`` (``LINK_KINDS``), ``to`` the target's
    path in the folder when it resolves inside (``file``/``dir``); ``local`` and ``local_to``
    the names of both under DEST/<job_id>/ (as a file's, ``local_names``)."""

    path: str
    target: str
    kind: str
    to: str = ""
    local: str = ""
    local_to: str = ""

    @property
    def inside(self) -> bool:
        return self.kind in ("file", "dir")


LINK_KINDS = ("file", "dir", "outside", "dangling", "loop", "other")


def safe_links(manifest: dict[str, Any], entries: list[Entry], odd_names: list[str] | None = None) -> list[Link]:
    """The manifest's ``links`` (none from an older server), checked as untrusted: a path or
    ``to`` that is not a plain relative path raises ``RemoteError``; a name with control
    characters is left out into ``odd_names``, as ``safe_entries`` does. Each gets its local
    name beside ``entries`` (those of ``safe_entries``)."""
    links = manifest.get("links", [])
    if not isinstance(links, list) or len(links) > MAX_FILES:
        raise RemoteError("the server's manifest lists its links malformed")
    out = []
    for item in links:
        if not isinstance(item, dict) or item.get("kind") not in LINK_KINDS or not isinstance(item.get("target"), str):
            raise RemoteError("the server's manifest holds a malformed link")
        path, to = item.get("path"), item.get("to") or ""
        if not isinstance(path, str) or not _plain(path) or not isinstance(to, str) or (to and not _plain(to)):
            raise RemoteError(f"refusing manifest link {ascii(path)[:120]} -> {ascii(to)[:120]}: "
                              "each must be a plain relative path")
        if BAD_CHARS.search(path) or BAD_CHARS.search(to):
            if odd_names is not None:
                odd_names.append(ascii(path)[:120])
            continue
        out.append(Link(path, item["target"][:300], item["kind"], to if item["kind"] in ("file", "dir") else ""))
    direct = _direct(entries)
    return [Link(k.path, k.target, k.kind, k.to, _local(k.path, *direct), _local(k.to, *direct) if k.to else "")
            for k in out]


def _plain(path: str) -> bool:
    return bool(path) and not path.startswith("/") and not any(part in ("", ".", "..") for part in path.split("/"))


def _direct(entries: list[Entry]) -> tuple[set[str], set[str]]:
    """The job-folder paths of ``entries`` outside ``code/``, and their folders."""
    direct = {e.path for e in entries if not e.path.startswith(CODE_PREFIX)}
    return direct, {p.rsplit("/", i)[0] for p in direct for i in range(1, p.count("/") + 1)}


def _local(path: str, direct: set[str], direct_dirs: set[str]) -> str:
    """``local_names``' rule for one path."""
    if not path.startswith(CODE_PREFIX):
        return path
    short = path[len(CODE_PREFIX):]
    parents = {short.rsplit("/", i)[0] for i in range(1, short.count("/") + 1)}
    return short if short not in direct and short not in direct_dirs and not parents & direct else path


def copies(link: Link, entries: list[Entry]) -> list[Entry]:
    """The files a copy of ``link``'s target inside the job folder is made of: each listed file
    of its target (the file, or every file under the folder), named under the link's own local
    name; empty when none is listed (the synced code, orch's own records)."""
    if link.kind == "file":
        return [Entry(e.path, e.size, e.sha256, link.local) for e in entries if e.path == link.to]
    if link.kind != "dir":
        return []
    return [Entry(e.path, e.size, e.sha256, link.local + e.path[len(link.to):])
            for e in entries if e.path.startswith(link.to + "/")]


def inside(dest: Path, local: str) -> bool:
    """True when ``dest/local`` stays inside ``dest`` (through the laptop's own symlinks too)."""
    root = os.path.realpath(dest)
    return os.path.realpath(os.path.join(root, local)).startswith(root + os.sep)


def local_names(entries: list[Entry]) -> list[Entry]:
    """Give each entry its name under DEST/<job_id>/: the job-folder path as it is, and a
    file the job wrote in its working directory (``code/outputs/x``) the path it wrote
    (``outputs/x``) — so a script's relative ``outputs/`` and ``$ORCH_JOB_DIR/outputs``
    land in the same place. On a clash with a job-folder path (same file, or a file where
    the other needs a folder) the working-directory file keeps its ``code/`` prefix."""
    direct = _direct(entries)
    return [Entry(e.path, e.size, e.sha256, _local(e.path, *direct)) for e in entries]


def safe_entries(manifest: Any, dest: Path, odd_names: list[str] | None = None) -> list[Entry]:
    """Validate an untrusted manifest; raise ``RemoteError`` naming the first bad entry (a
    path that is absolute, holds ``..`` or empty parts, or resolves outside ``dest``). A
    name with control characters or a backslash — legal on Linux, so a job may write one —
    is left out instead, its ``ascii()`` form appended to ``odd_names``."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        raise RemoteError("the server's manifest.json is malformed")
    if len(manifest["files"]) > MAX_FILES:
        raise RemoteError("the server's manifest lists too many files")
    out = []
    for item in manifest["files"]:
        if not isinstance(item, dict):
            raise RemoteError("the server's manifest holds a malformed entry")
        path, size, digest = item.get("path"), item.get("size"), item.get("sha256")
        shown = ascii(path)[:120]
        if not isinstance(path, str) or not path or path.startswith("/") \
                or any(part in ("", ".", "..") for part in path.split("/")):
            raise RemoteError(f"refusing manifest path {shown}: it must be a plain relative path")
        if BAD_CHARS.search(path):
            if odd_names is not None:
                odd_names.append(shown)
            continue
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or size > 1 << 44:
            raise RemoteError(f"refusing manifest entry {shown}: bad size")
        if not isinstance(digest, str) or not SHA_RE.match(digest):
            raise RemoteError(f"refusing manifest entry {shown}: bad sha256")
        out.append(Entry(path, size, digest))
    out = local_names(out)
    for entry in out:
        if not inside(dest, entry.local):
            raise RemoteError(f"refusing manifest path {ascii(entry.path)[:120]}: it resolves outside {dest}")
    return out

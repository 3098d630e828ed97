"""A server's manifest as ``orch fetch`` reads it: untrusted entries checked (``safe_entries``)
and named under ``DEST/<job_id>/`` (``local_names``)."""

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


def local_names(entries: list[Entry]) -> list[Entry]:
    """Give each entry its name under DEST/<job_id>/: the job-folder path as it is, and a
    file the job wrote in its working directory (``code/outputs/x``) the path it wrote
    (``outputs/x``) — so a script's relative ``outputs/`` and ``$ORCH_JOB_DIR/outputs``
    land in the same place. On a clash with a job-folder path (same file, or a file where
    the other needs a folder) the working-directory file keeps its ``code/`` prefix."""
    direct = {e.path for e in entries if not e.path.startswith(CODE_PREFIX)}
    direct_dirs = {p.rsplit("/", i)[0] for p in direct for i in range(1, p.count("/") + 1)}
    out = []
    for e in entries:
        name = e.path
        if name.startswith(CODE_PREFIX):
            short = name[len(CODE_PREFIX):]
            parents = {short.rsplit("/", i)[0] for i in range(1, short.count("/") + 1)}
            if short not in direct and short not in direct_dirs and not parents & direct:
                name = short
        out.append(Entry(e.path, e.size, e.sha256, name))
    return out


def safe_entries(manifest: Any, dest: Path, odd_names: list[str] | None = None) -> list[Entry]:
    """Validate an untrusted manifest; raise ``RemoteError`` naming the first bad entry (a
    path that is absolute, holds ``..`` or empty parts, or resolves outside ``dest``). A
    name with control characters or a backslash — legal on Linux, so a job may write one —
    is left out instead, its ``ascii()`` form appended to ``odd_names``."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        raise RemoteError("the server's manifest.json is malformed")
    if len(manifest["files"]) > MAX_FILES:
        raise RemoteError("the server's manifest lists too many files")
    root = os.path.realpath(dest)
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
        target = os.path.realpath(os.path.join(root, entry.local))
        if not target.startswith(root + os.sep):
            raise RemoteError(f"refusing manifest path {ascii(entry.path)[:120]}: it resolves outside {dest}")
    return out

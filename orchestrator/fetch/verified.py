"""What earlier fetches of a job verified, so a fetch with nothing new costs one round trip.

``ORCH_HOME/fetched/<digest of the destination folder's real path>.json`` = {"files": {name:
[size, mtime_ns, sha256]}, "told": [host]} (kept out of the destination, which holds only what
was fetched and orch's marker).
A local file whose size and modification time still equal its row was verified against that
sha256 when it was written (rsync's quick check: an edit changes the mtime), so it is not read
again; any other file is hashed as before. ``told``: hosts already told that this job's outputs
are on the laptop (the ``fetched`` request, which ``on_finish: shutdown`` waits for; the
server keeps that mark for good). A missing or broken record only means more hashing.

``CheckpointFolders``: how a checkpoint folder is fetched whole (a hidden sibling, renamed
into place once every file of it is verified).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from orchestrator.home import orch_home, write_private
from orchestrator.sync.selection import sha256_of
from remote_payload.contract.jobfolder import NAME_MAX, temp_name

# A file of a checkpoint folder, by its fetched name: (…/checkpoints, step-<N>, path inside).
CHECKPOINT = re.compile(r"^((?:[^/]+/)*checkpoints)/(step-\d+)/(.+)$")
HIDDEN = ".part-"  # …/checkpoints/.part-step-<N>/: a checkpoint folder being fetched
GONE = ".gone-"  # …/checkpoints/.gone-step-<N>/: a checkpoint folder being removed
COMPLETE = "COMPLETE"  # written last into a checkpoint folder (remote_payload/trainer/checkpoint.py)


def beside(name: str, prefix: str) -> str:
    """``prefix + name`` (a hidden sibling of folder ``name``), or a fixed-length temporary
    name when that would not fit in a file name."""
    marked = prefix + name
    return marked if len(marked.encode("utf-8", "surrogateescape")) <= NAME_MAX else temp_name(marked)


class FetchState:
    def __init__(self, dest: Path) -> None:
        digest = hashlib.sha256(os.path.realpath(dest).encode()).hexdigest()[:24]
        self.path = orch_home() / "fetched" / f"{digest}.json"
        try:
            data: Any = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        files = data.get("files") if isinstance(data, dict) else None
        told = data.get("told") if isinstance(data, dict) else None
        self.files: dict[str, list[Any]] = files if isinstance(files, dict) else {}
        self.told: set[str] = {t for t in told if isinstance(t, str)} if isinstance(told, list) else set()
        self.dirty = False

    def known(self, name: str, local: Path, size: int, sha256: str) -> bool:
        """True when ``local`` is a file an earlier fetch verified with ``size`` and ``sha256``
        and its size and mtime have not moved since (never hashes)."""
        try:
            st = local.stat()
        except OSError:
            return False
        return self.files.get(name) == [st.st_size, st.st_mtime_ns, sha256] and st.st_size == size

    def has(self, name: str, local: Path, size: int, sha256: str) -> bool:
        """True when ``local`` holds ``size`` bytes with ``sha256`` (hashed only when its size
        or mtime moved since it was verified)."""
        try:
            st = local.stat()
        except OSError:
            return False
        if st.st_size != size:
            return False
        if self.files.get(name) == [st.st_size, st.st_mtime_ns, sha256]:
            return True
        if sha256_of(local) != sha256:
            return False
        self.files[name], self.dirty = [st.st_size, st.st_mtime_ns, sha256], True
        return True

    def verified(self, name: str, local: Path, sha256: str) -> None:
        """``local`` was just written and checked against ``sha256``."""
        st = local.stat()
        self.files[name], self.dirty = [st.st_size, st.st_mtime_ns, sha256], True

    def tell(self, host: str) -> None:
        """``host`` now knows the outputs are here."""
        self.told.add(host)
        self.dirty = True

    def save(self) -> None:
        """Write the record, when anything in it changed."""
        if not self.dirty:
            return
        try:
            write_private(self.path, json.dumps({"files": self.files, "told": sorted(self.told)}))
        except OSError:
            pass  # a record to save work: without it the next fetch hashes again

    def move(self, old: str, new: str) -> None:
        """Rows under the folder ``old/`` now live under ``new/`` (the folder was renamed; a
        rename keeps sizes and mtimes, so its verified files stay trusted)."""
        moved = {name: row for name, row in self.files.items() if name.startswith(old + "/")}
        for name, row in moved.items():
            del self.files[name]
            self.files[new + name[len(old):]] = row
        self.dirty = self.dirty or bool(moved)

    def forget(self, folder: str) -> None:
        """Drop the rows under ``folder/`` (it was removed)."""
        gone = [name for name in self.files if name.startswith(folder + "/")]
        for name in gone:
            del self.files[name]
        self.dirty = self.dirty or bool(gone)


class CheckpointFolders:
    """A checkpoint folder lands whole: ``…/checkpoints/step-<N>/`` (the built-in trainer's
    layout, remote_payload/trainer/checkpoint.py; any depth, so ``outputs/checkpoints/step-<N>/`` too)
    is fetched into the hidden sibling ``…/checkpoints/.part-step-<N>/`` and renamed into place
    only when every file the server lists for it is here and verified — a folder under its
    final name is never missing a file. While the job runs, a folder is taken only once it
    lists ``COMPLETE`` (the trainer writes it last, then renames ``tmp-<N>`` to ``step-<N>``);
    once the job ended, every folder is taken as it is. A local folder that no longer matches
    the server's listing is moved aside to the hidden name, completed, and renamed back.

    ``listed``: each checkpoints folder's ``step-*`` names that a node listed (for pruning);
    ``committed``: folders renamed into place by ``commit``."""

    def __init__(self, dest: Path, state: FetchState) -> None:
        self.dest, self.state = dest, state
        self.listed: dict[str, set[str]] = {}
        self.staged: dict[str, list[Any]] = {}  # final folder -> its entries, named in the hidden one
        self.committed: list[str] = []

    def stage(self, entries: list[Any], running: bool) -> list[Any]:
        """``entries`` (fetch's ``Entry``, selected) with each checkpoint folder's files renamed
        into its hidden sibling, or left out while the job runs and the folder lacks COMPLETE;
        a folder already here whole keeps its names (nothing to fetch)."""
        out: list[Any] = []
        groups: dict[tuple[str, str], list[tuple[Any, str]]] = {}
        for entry in entries:
            match = CHECKPOINT.match(entry.local)
            if match is None:
                out.append(entry)
            else:
                groups.setdefault((match[1], match[2]), []).append((entry, match[3]))
        for (parent, step), members in groups.items():
            self.listed.setdefault(parent, set()).add(step)
            if running and not any(rest == COMPLETE for _, rest in members):
                continue
            final, hidden = f"{parent}/{step}", f"{parent}/{beside(step, HIDDEN)}"
            if all(self.state.has(e.local, self.dest / e.local, e.size, e.sha256) for e, _ in members):
                _remove(self.dest / hidden, self.state, hidden)
                out.extend(e for e, _ in members)
                continue
            if (self.dest / final).is_dir():
                _remove(self.dest / hidden, self.state, hidden)
                os.replace(self.dest / final, self.dest / hidden)
                self.state.move(final, hidden)
            staged = [dataclasses.replace(e, local=f"{hidden}/{rest}") for e, rest in members]
            self.staged[final] = staged
            out.extend(staged)
        return out

    def commit(self) -> list[str]:
        """Rename each staged folder whose listed files are all here and verified into place
        (files it holds that the server does not list are removed first); returns those."""
        for final, staged in self.staged.items():
            parent, step = final.rsplit("/", 1)
            hidden = f"{parent}/{beside(step, HIDDEN)}"
            if not all(self.state.has(e.local, self.dest / e.local, e.size, e.sha256) for e in staged):
                continue  # the next fetch completes it
            listed = {self.dest / e.local for e in staged}
            for path in sorted((self.dest / hidden).rglob("*"), reverse=True):
                if path.is_dir() and not path.is_symlink():
                    if not any(p.is_relative_to(path) for p in listed):
                        shutil.rmtree(path, ignore_errors=True)
                elif path not in listed:
                    path.unlink(missing_ok=True)
            if (self.dest / final).exists():
                _remove(self.dest / final, self.state, final)
            os.replace(self.dest / hidden, self.dest / final)
            self.state.move(hidden, final)
            self.committed.append(final)
        self.staged = {}
        return self.committed


def _remove(path: Path, state: FetchState, name: str) -> None:
    """Remove the folder ``path`` (named ``name`` under the destination) and its rows."""
    if path.is_dir() and not path.is_symlink():
        remove_folder(path)
        state.forget(name)


def remove_folder(path: Path) -> None:
    """Remove a checkpoint folder without ever showing it half-deleted under its name: it is
    renamed to the hidden ``.gone-<name>`` first (``prune`` removes any such leftover)."""
    gone = path.with_name(beside(path.name, GONE))
    os.replace(path, gone)
    shutil.rmtree(gone, ignore_errors=True)

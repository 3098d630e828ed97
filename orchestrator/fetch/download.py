"""Fetch a job's files into ``DEST/<job_id>/``, verified.

Promises: only files whose paths ``outputs`` selects; each downloaded as ``<name>.part`` (a
fixed-length name where that would not fit: ``part_path``), resumed from its size when one is
there, sha256-checked against the manifest, then renamed — nothing unverified ever stands
under a final name. A name this laptop cannot hold (too long for its file system or path) is
never requested: it is listed (``FetchSummary.unwritable``) and the rest fetched. The manifest comes from the
server and is untrusted: a path that is absolute, holds ``..`` or control characters, or
would land outside the destination (through a symlink too) is refused and nothing is
written for it. A second fetch with nothing new transfers no file data.
"""

from __future__ import annotations

import errno
import hashlib
import os
import queue
import threading
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from orchestrator.access.connect import open_transport
from orchestrator.errors import LocalFileError, RemoteError, UsageError
from orchestrator.fetch import links as fetch_links
from orchestrator.fetch.manifest import CODE_PREFIX, Entry, safe_entries, safe_links
from orchestrator.fetch.verified import CheckpointFolders, FetchState
from orchestrator.globs.match import Patterns
from orchestrator.globs.read import PatternError
from orchestrator.helper.remote import FileStream, Remote
from orchestrator.hosts.inventory import Inventory
from orchestrator.jobs.nodes import nodes_of
from orchestrator.state import runs
from orchestrator.state.registry import JobRecord, Registry
from orchestrator.transport.base import never
from remote_payload.contract.jobfolder import NAME_MAX, temp_name


@dataclass
class FetchSummary:
    dest: Path
    fetched: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    bytes: int = 0
    patterns: list[str] = field(default_factory=list)
    unselected: list[Entry] = field(default_factory=list)
    here: set[str] = field(default_factory=set)  # unselected names an earlier fetch verified here (--include)
    ended: bool = True
    states: list[str] = field(default_factory=list)  # each node's job state, as its manifest said
    checkpoints: dict[str, set[str]] = field(default_factory=dict)  # verified.CheckpointFolders.listed
    committed: list[str] = field(default_factory=list)  # checkpoint folders renamed into place
    unwritable: list[str] = field(default_factory=list)  # names this laptop cannot hold: "name (reason)", ascii()
    links: list[fetch_links.LinkSeen] = field(default_factory=list)  # the selected symlinks, each node's once


DEFAULT_OUTPUTS = ["outputs/", "logs/", "metrics.jsonl"]


def fetch(record: JobRecord, inventory: Inventory, dest_parent: Path, say: Callable[[str], None],
          extra: list[str] | None = None, everything: bool = False,
          remotes: list[Remote] | None = None, tell: bool = True, follow_links: bool = False) -> FetchSummary:
    """Fetch the files the job's own ``outputs`` (recorded in its job.json) select, plus
    ``extra`` patterns; ``everything`` fetches the whole job folder but the synced code.
    Patterns match the fetched name: a file the job wrote in its working directory
    (``code/outputs/x`` on the server) is named as written (``outputs/x``). On a multi-node
    job every node is asked in host order and a path is taken from the first node that has
    it (outputs come from whichever node holds torch's rank 0; each node's logs have their
    own names). The destination is marked as orch's (``runs.MARKER``), so it is never synced
    back. The summary says what was not selected (``nothing_selected``, ``unfetched``) and which
    of that an earlier fetch brought here already (``here``). A checkpoint
    folder lands whole (``verified.CheckpointFolders``). ``remotes``: open connections to
    the nodes, in host order, used instead of new ones; ``tell=False`` leaves the ``fetched``
    request to the caller (``orch fetch --watch``, watch.py). The job folder's symlinks that
    the patterns select are never followed on the server; each is in ``summary.links`` (where it
    points, whether inside the folder); ``follow_links`` fetches a copy of the target of each one
    that stays inside the folder, from the target's own listed files (``links.select``). A node
    whose job had ended and whose selected files are all here, verified, is recorded as fetched
    from that host (``Registry.record_fetched``: what ``orch gc`` may remove there)."""
    dest = runs.run_dir(dest_parent, record.job_id)
    summary = FetchSummary(dest)
    taken: set[str] = set()
    state = FetchState(dest)
    folders = CheckpointFolders(dest, state)
    try:
        for i, host in enumerate(nodes_of(record, inventory)):
            with ExitStack() as stack:
                remote = remotes[i] if remotes else \
                    Remote(host, stack.enter_context(open_transport(host, inventory, never)))
                complete = _fetch_node(remote, record.job_id, dest, summary, taken, say, extra or [], everything,
                                       folders, follow_links)
                if complete and host.name not in record.fetched:
                    Registry().record_fetched(record.job_id, host.name)  # orch gc may remove its folder there
                if complete and tell and host.name not in state.told:
                    remote.call("fetched", job=record.job_id)  # lets on_finish.shutdown go ahead
                    state.tell(host.name)
        summary.committed, summary.checkpoints = folders.commit(), folders.listed
    finally:
        state.save()
    summary.unselected = [e for e in summary.unselected if e.local not in taken]
    return summary


def _fetch_node(remote: Remote, job_id: str, dest: Path, summary: FetchSummary, taken: set[str],
                say: Callable[[str], None], extra: list[str], everything: bool, folders: CheckpointFolders,
                follow_links: bool = False) -> bool:
    """Fetch one node's share; True when the job had ended and everything selected is here."""
    host, state = remote.host, folders.state
    manifest = remote.call("manifest", job=job_id)
    odd: list[str] = []
    entries = safe_entries(manifest, dest, odd)
    links = safe_links(manifest, entries, odd)
    if odd:
        say(f"{host.name}: not fetched, names with control characters: {', '.join(odd[:5])}"
            + (f" (+{len(odd) - 5} more)" if len(odd) > 5 else ""))
    outputs = manifest.get("outputs")
    if not (isinstance(outputs, list) and all(isinstance(p, str) for p in outputs)):
        outputs = DEFAULT_OUTPUTS
    summary.patterns = ["*"] if everything else list(dict.fromkeys([*outputs, *extra]))
    try:  # matched in time linear in a name's length: the names come from the server
        spec = Patterns(summary.patterns)
    except PatternError as exc:
        raise UsageError(f"{host.name}: the fetch's patterns ({', '.join(summary.patterns)}): {exc}") from None
    running = manifest.get("state") not in ("succeeded", "failed", "cancelled")
    summary.ended = summary.ended and not running
    summary.states.append(str(manifest.get("state")))
    wanted: list[Entry] = []
    selected: list[Entry] = []
    for entry in entries:
        if entry.local in taken:
            continue
        if not spec.match(entry.local):
            summary.unselected.append(entry)
            if state.known(entry.local, dest / entry.local, entry.size, entry.sha256):
                summary.here.add(entry.local)
            continue
        taken.add(entry.local)
        selected.append(entry)
    selected += fetch_links.select(links, entries, spec, dest, taken, summary.links, follow_links)
    for entry in folders.stage(selected, running):
        local = dest / entry.local
        if not _writable(dest, entry, summary):
            continue
        if local.is_file() and state.has(entry.local, local, entry.size, entry.sha256):
            summary.unchanged.append(entry.local)
        else:
            wanted.append(entry)  # a link's copy asks for its target's path again: a list, in request order
    if not wanted:
        return not running and not summary.unwritable
    requests = []
    for entry in wanted:
        part = part_path(dest, entry.local)
        offset = part.stat().st_size if part.is_file() else 0
        requests.append({"path": entry.path, "offset": offset if offset <= entry.size else 0, "size": entry.size})
    say(f"fetching {len(wanted)} file(s), {sum(e.size for e in wanted) / 2**20:.1f} MB from {host.name}")
    proc = remote.start("send", job=job_id, files=requests)
    reader = FileStream(proc)
    for entry, req in zip(wanted, requests):
        header = reader.header()
        size = header.get("size")
        if header.get("path") != req["path"] or header.get("offset") != req["offset"] \
                or not isinstance(size, int) or not 0 <= size <= entry.size - req["offset"]:
            raise RemoteError(f"{host.name}: unexpected file header {ascii(header)[:200]}")
        try:
            summary.bytes += receive_file(reader, dest, entry, req["offset"], size)
        except NameNotWritable as exc:
            summary.unwritable.append(str(exc))
            continue
        except ChangedWhileFetching as exc:
            if not running:
                raise RemoteError(str(exc)) from None
            say(f"skipped {entry.local}: it changed while the job runs (fetch again later)")
            continue
        summary.fetched.append(entry.local)
        state.verified(entry.local, dest / entry.local, entry.sha256)
    if reader.header() != {"end": True}:
        raise RemoteError(f"{host.name}: the file stream did not end cleanly")
    remote.finish(proc, "fetch")
    return not running and not summary.unwritable


class ChangedWhileFetching(Exception):
    pass


class NameNotWritable(Exception):
    """A file the laptop cannot create under its name (too long for this file system or
    path, or bytes it refuses); ``str`` names it (``ascii()``) and says why."""


# What a file system answers for a name it cannot hold (macOS: EILSEQ for bytes that are not UTF-8).
NAME_ERRORS = (errno.ENAMETOOLONG, errno.EILSEQ, errno.EINVAL)


def _name_max(folder: Path) -> int:
    """The longest file name (bytes) ``folder``'s file system takes."""
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return NAME_MAX


def part_path(dest: Path, local: str, suffix: str = ".part") -> Path:
    """Where ``dest/local`` is written before it is verified: ``<name><suffix>`` beside it, or
    a short fixed-length name when that would not fit (``jobfolder.temp_name``)."""
    final = dest / local
    return final.with_name(temp_name(final.name, suffix, _name_max(final.parent) if final.parent.is_dir() else NAME_MAX))


def _writable(dest: Path, entry: Entry, summary: FetchSummary) -> bool:
    """Whether ``entry`` can be written here under its name: its folders are made, and its
    name and its ``.part`` are looked up (a name too long answers ENAMETOOLONG without
    creating anything). One that cannot is named in ``summary.unwritable``, never requested."""
    final = dest / entry.local
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        for path in (final, part_path(dest, entry.local)):
            try:
                path.lstat()
            except FileNotFoundError:
                pass
    except OSError as exc:
        if exc.errno not in NAME_ERRORS:
            raise LocalFileError(f"cannot write {final} ({exc.strerror or exc}); fix that (or fetch with --dest DIR), "
                                 "then run the same `orch fetch` again") from None
        summary.unwritable.append(f"{ascii(entry.local)[1:-1]} ({exc.strerror or exc})")
        return False
    return True


class _Hasher:
    """sha256 in a thread of its own, so hashing overlaps with receiving and writing (hashlib
    releases the GIL on large blocks). ``hexdigest`` ends the thread."""

    def __init__(self) -> None:
        self.h, self.blocks = hashlib.sha256(), queue.Queue(maxsize=16)
        self.thread = threading.Thread(target=self._run, daemon=True, name="orch-fetch-hash")
        self.thread.start()

    def _run(self) -> None:
        while (block := self.blocks.get()) is not None:
            self.h.update(block)

    def update(self, block: bytes) -> None:
        self.blocks.put(block)

    def hexdigest(self) -> str:
        if self.thread.is_alive():
            self.blocks.put(None)
            self.thread.join()
        return self.h.hexdigest()


def receive_file(reader: FileStream, dest: Path, entry: Entry, offset: int, size: int, suffix: str = ".part") -> int:
    """Append ``size`` streamed bytes to the ``<name><suffix>`` file at ``offset``; rename it
    into place only when it has the manifest's size and sha256 (else it is deleted and
    ``ChangedWhileFetching`` raised). A laptop-side write failure (the disk is full, a folder
    not writable) is a ``LocalFileError`` naming the file; the part keeps what was written, so
    the same fetch resumes once the cause is fixed."""
    final = dest / entry.local
    part = part_path(dest, entry.local, suffix)
    h = _Hasher()
    remaining = size
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        if offset:
            with open(part, "rb") as f:
                while block := f.read(1 << 20):
                    h.update(block)
        with open(part, "r+b" if offset else "wb") as f:
            f.seek(offset)
            f.truncate()
            while remaining:
                data = reader.take(min(remaining, 1 << 20))  # a broken stream is an OrchError
                f.write(data)
                h.update(data)
                remaining -= len(data)
    except OSError as exc:
        if exc.errno in NAME_ERRORS:
            _drain(reader, remaining)
            raise NameNotWritable(f"{ascii(entry.local)[1:-1]} ({exc.strerror or exc})") from None
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise LocalFileError(f"the laptop's disk is full: cannot write {part} ({exc.strerror}); free space, "
                                 "then run the same `orch fetch` again: it resumes from the .part file") from None
        raise LocalFileError(f"cannot write {exc.filename or part} ({exc.strerror or exc}); fix that (or fetch "
                             "with --dest DIR), then run the same `orch fetch` again") from None
    finally:
        digest = h.hexdigest()  # ends its thread, however the loop ended
    if offset + size != entry.size or digest != entry.sha256:
        part.unlink()
        raise ChangedWhileFetching(f"{entry.local}: size or sha256 differs from the manifest (discarded; fetch again)")
    try:
        os.replace(part, final)
    except OSError as exc:
        if exc.errno not in NAME_ERRORS:
            raise
        part.unlink()
        raise NameNotWritable(f"{ascii(entry.local)[1:-1]} ({exc.strerror or exc})") from None
    return size


def _drain(reader: FileStream, remaining: int) -> None:
    """Read past ``remaining`` bytes of the stream (a file that cannot be written here)."""
    while remaining:
        remaining -= len(reader.take(min(remaining, 1 << 20)))


def unwritable_error(summary: FetchSummary) -> LocalFileError:
    """Exit 2 naming the files this laptop cannot hold under their names (the rest was fetched)."""
    shown = "; ".join(summary.unwritable[:5]) + (f"; +{len(summary.unwritable) - 5} more" if len(summary.unwritable) > 5
                                                 else "")
    return LocalFileError(f"not fetched, {len(summary.unwritable)} file(s) this laptop cannot hold under their names: "
                          f"{shown}; everything else was fetched into {summary.dest}. Fetch into a folder with a "
                          "shorter path (--dest DIR), or have the job write shorter names")


def nothing_selected(summary: FetchSummary, job_id: str) -> str:
    """Why a fetch moved nothing: the patterns, what the job folder does hold (top-level
    folders and files with counts), and, when the job wrote files in its working directory
    that no pattern selects, how to fetch them."""
    groups: dict[str, list[Entry]] = {}
    for entry in summary.unselected:
        head, sep, _ = entry.local.partition("/")
        groups.setdefault(head + sep, []).append(entry)
    lines = [f"nothing to fetch: the job's outputs patterns ({', '.join(summary.patterns)}) select no file"
             + ("" if summary.ended else " yet (the job is still running)")]
    if not groups:
        lines.append("the job folder holds no file yet")
        return "\n".join(lines)
    held = []
    for top, members in sorted(groups.items(), key=lambda kv: -sum(e.size for e in kv[1])):
        size = sum(e.size for e in members) / 2**20
        wrote = " (written by the job in its working directory)" if all(e.path.startswith(CODE_PREFIX) for e in members) else ""
        held.append(f"{top} ({len(members)} file(s), {size:.1f} MB){wrote}")
    lines.append("the job folder holds: " + "; ".join(held[:8]) + (f"; +{len(held) - 8} more" if len(held) > 8 else ""))
    by_job = [top for top, members in groups.items() if any(e.path.startswith(CODE_PREFIX) for e in members)]
    likely = by_job or [top for top in groups if top == "checkpoints/"]
    if likely:
        flags = " ".join(f"--include {top}" for top in likely[:3])
        lines.append(f"to fetch them: orch fetch {job_id} {flags}  (or add them to `outputs:` in the job file)")
    return "\n".join(lines)

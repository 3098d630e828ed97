"""Moving workspace files: ``sync`` (choose, diff, send), one tar stream to the helper's
``receive`` (``send``), and files edited on the server back to the laptop (``pull``). What to
move is decided in ``selection.py``.

Promises: every file lands on the server under a temporary name and is renamed into place;
a file that changed while it was read is sent again; no thread ever prints a traceback —
a writer's failure is raised in the caller, the laptop's own cause (a file it cannot read)
before a broken stream's. Ctrl-C closes the stream at once (``send_all``) and says what the
server kept; the next sync continues a large cut-off file from the bytes kept there.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import stat
import tarfile
import threading
from pathlib import Path
from typing import Any, Callable

from orchestrator import settings, trace
from orchestrator.errors import Interrupted, OrchError, RemoteError, UsageError
from orchestrator.helper.remote import FileStream, Remote
from orchestrator.sync import record as synccache
from orchestrator.sync import tarstream
from orchestrator.sync.selection import SyncPlan, few, plan_sync, project_name, select_files, sha256_of
from orchestrator.testhooks import pause
from orchestrator.transport.base import Process
from remote_payload.contract.jobfolder import temp_name


COPY_BYTES = 1 << 20  # a file's bytes are read, hashed and written in blocks of this size


class _ProcessWriter(io.RawIOBase):
    """The process's stdin as a raw file; once ``dropped`` (the stream failed), writes go nowhere.
    ``data`` (the buffered writer's own memory) is handed on uncopied: every ``Process.write``
    is done with it when it returns (a helper session frames it, a pipe or a socket sends it)."""

    def __init__(self, proc: Process) -> None:
        self.proc, self.dropped = proc, False

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if not self.dropped:
            self.proc.write(data)
        return len(data)


class _HashingReader:
    """Reads exactly ``size`` bytes of ``f``, hashing them; a file that shrank meanwhile is
    padded with zeros (and flagged) instead of breaking the stream."""

    def __init__(self, f: Any, size: int, start: Any = None) -> None:
        self.f, self.left, self.short = f, size, False
        self.hash = start if start is not None else hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n)
        if len(data) < n:
            self.short = True
            data += b"\0" * (n - len(data))
        self.left -= len(data)
        self.hash.update(data)
        return data


class _TarWriter:
    """Members onto ``out`` as one tar stream (``tarstream``: ustar headers, pax where needed)."""

    def __init__(self, out: Any) -> None:
        self.out, self.written = out, 0

    def add(self, info: tarfile.TarInfo, data: Any = None) -> None:
        """``info``'s header, then ``info.size`` bytes read from ``data`` in ``COPY_BYTES`` blocks."""
        head = tarstream.header(info)
        self.out.write(head)
        left = info.size if data is not None else 0
        while left:
            block = data.read(min(left, COPY_BYTES))
            if not block:  # _HashingReader pads a shrunk file: only a broken reader gets here
                raise OSError("%s: %d bytes short" % (info.name, left))
            self.out.write(block)
            left -= len(block)
        self.out.write(tarstream.padding(info.size))
        self.written += len(head) + info.size + (-info.size % tarstream.BLOCK)

    def close(self) -> None:
        self.out.write(tarstream.end(self.written))


def _write_stream(proc: Process, root: Path, plan: SyncPlan, progress: Callable[[int], None] | None) -> list[str]:
    """Write the plan as one tar to ``proc``; return the files that changed between planning
    and sending (or while being read): their server copy may be torn, so they go again."""
    # the C BufferedWriter gathers headers and small files into COPY_BYTES writes; a file's
    # own blocks pass straight through.
    raw = _ProcessWriter(proc)
    out = io.BufferedWriter(raw, COPY_BYTES)
    try:
        tar = _TarWriter(out)
        changed = _write_members(tar, root, plan, progress)
        tar.close()
        out.flush()
    except BaseException:
        raw.dropped = True  # what the buffer holds is never sent, nor flushed when it is collected
        raise
    proc.close_stdin()
    return changed


def _write_members(tar: _TarWriter, root: Path, plan: SyncPlan, progress: Callable[[int], None] | None) -> list[str]:
    """``.orch-sync.json``, then every file and symlink of ``plan.send``; the files that changed
    while they were read (``_write_stream``)."""
    changed: list[str] = []
    top = str(root)
    source = {"laptop": platform.node(), "path": top}  # shown by `orch hosts check`
    control = json.dumps(dict(plan.control(), source=source)).encode()
    info = tarfile.TarInfo(".orch-sync.json")
    info.size = len(control)
    tar.add(info, io.BytesIO(control))
    for rel in plan.send:
        entry = plan.entries[rel]
        info = tarfile.TarInfo(rel)
        if entry["link"] is not None:
            info.type, info.linkname = tarfile.SYMTYPE, entry["link"]
            tar.add(info)
            continue
        try:
            f = open(os.path.join(top, rel), "rb")
        except FileNotFoundError:
            changed.append(rel)  # deleted since planning: not sent; the next round drops it
            continue
        with f:
            before = os.fstat(f.fileno())
            info.size, info.mode = before.st_size, entry["mode"]
            start = _resume(f, info, plan.resume.get(rel))
            reader = _HashingReader(f, info.size, start)
            tar.add(info, reader)
            after = os.fstat(f.fileno())
        stats = {(entry["size"], entry["mtime_ns"]), (before.st_size, before.st_mtime_ns),
                 (after.st_size, after.st_mtime_ns)}  # planned, opened, read: a new file is checked by these
        if reader.short or entry["sha256"] not in (None, reader.hash.hexdigest()) or len(stats) > 1:
            changed.append(rel)
        else:  # what the server now holds: a staged tree is checked against it (SyncPlan.control)
            entry["sha256"] = reader.hash.hexdigest()
        if progress:
            progress(info.size)
    return changed


def _resume(f: Any, info: tarfile.TarInfo, resume: dict[str, Any] | None) -> Any:
    """Make ``info`` continue the partial the server kept (``SyncPlan.resume``): only the
    bytes past its ``offset``, with ``orch.offset``, ``orch.prefix`` and ``orch.sha256`` for
    the server to check; returns the sha256 of the first bytes, read again here (``f`` is left
    at the offset), or None — and ``f`` at 0 — when they no longer match (the file changed
    since planning: it goes whole)."""
    if resume is None or info.size <= resume["offset"]:
        return None
    h, left = hashlib.sha256(), resume["offset"]
    while left and (block := f.read(min(left, 1 << 20))):
        h.update(block)
        left -= len(block)
    if left or h.hexdigest() != resume["prefix"]:
        f.seek(0)
        return None
    info.size -= resume["offset"]
    info.pax_headers = {"orch.offset": str(resume["offset"]), "orch.prefix": resume["prefix"],
                        "orch.sha256": resume["sha256"]}
    return h


def _replan(root: Path, plan: SyncPlan, changed: list[str], base: str | None,
            recorded: dict[str, Any] | None, stage_tree: bool = False) -> SyncPlan:
    """A plan that sends ``changed`` again as they are now (and deletes the vanished ones),
    as changes to the record ``base`` the last round left (every entry when unknown); the
    stage's tree itself with ``stage_tree`` (or when the last round sent it)."""
    again = SyncPlan(entries=dict(plan.entries), base=base if recorded is not None else None, recorded=recorded or {},
                     stage=plan.stage, stage_tree=stage_tree or plan.stage_tree)
    for rel in changed:
        path = root / rel
        try:
            st = os.lstat(path)
            link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
            digest = None if link is not None else sha256_of(path)
        except FileNotFoundError:
            again.entries.pop(rel, None)
            again.delete.append(rel)
            continue
        again.entries[rel] = dict(plan.entries[rel], size=0 if link is not None else st.st_size,
                                  mtime_ns=st.st_mtime_ns, sha256=digest, link=link)
        again.send.append(rel)
        again.send_bytes += st.st_size
    again.changed = {rel: again.entries[rel] for rel in again.send}
    return again


SEND_ROUNDS = 3
# An earlier receive of the same workspace that made no progress for this long is stopped
# and its lock taken over (remote_payload/jobdir/lease.py); tests shorten it.


class Kept:
    """What one host's ``receive`` said it holds so far (its JSON lines: files renamed into
    place, the file being written and its bytes there; untrusted), and the stream to stop on
    Ctrl-C. ``words`` is its part of the line an interrupted submit prints."""

    def __init__(self, host: str) -> None:
        self.host, self.call = host, None
        self.files = self.earlier = self.have = 0
        self.file: str | None = None
        self.buf = b""

    def hear(self, data: bytes) -> None:
        self.buf = (self.buf + data)[-(1 << 16):]
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            try:
                said = json.loads(line)
                files, have, name = said["files"], said["have"], said["file"]
            except (ValueError, KeyError, TypeError):
                continue
            if isinstance(files, int) and isinstance(have, int) and isinstance(name, (str, type(None))):
                self.files, self.have, self.file = self.earlier + files, have, name

    def round_done(self, written: int) -> None:
        self.earlier += written
        self.files, self.have, self.file = self.earlier, 0, None

    def stop(self) -> None:
        """Close the stream now: the server keeps what arrived (never waits for it to drain)."""
        if self.call is not None:
            try:
                self.call.kill()
            except Exception:  # noqa: BLE001 - the link may be gone already
                pass

    def words(self) -> str:
        held = [f"{self.files} file(s)"] if self.files else []
        if self.file and self.have > 0:
            name = self.file if len(self.file) <= 40 else "…" + self.file[-39:]
            held.append(f"{self.have / 2**20:.1f} MB of {name}")
        return f"{self.host} kept " + (" and ".join(held) if held else "nothing yet")


def send_all(remotes: list[Remote], project: str, root: Path, plans: list[SyncPlan],
             failed: Callable[[int, OrchError], None] | None = None) -> list[dict[str, Any] | None]:
    """``send`` each host its plan, all at once; the summaries in host order, or the first
    error. With ``failed``, a host's ``OrchError`` goes to ``failed(index, error)`` instead
    (its summary is None) and the other hosts go on. Ctrl-C stops every stream at once
    (``Kept.stop``) and raises ``Interrupted`` with one line saying what each server kept: the
    files complete there, and the bytes of a large file cut off, which the next sync
    continues (``SyncPlan.resume``)."""
    kept = [Kept(r.host.name) for r in remotes]
    results: list[Any] = [None] * len(remotes)

    def one(i: int) -> None:
        try:
            results[i] = send(remotes[i], project, root, plans[i], kept=kept[i])
        except BaseException as exc:  # noqa: BLE001 - raised by the caller below
            results[i] = exc

    try:
        if len(remotes) == 1:
            one(0)
        else:
            threads = [threading.Thread(target=one, args=(i,), daemon=True, name=f"orch-sync-{i}")
                       for i in range(len(remotes))]
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)
    except KeyboardInterrupt:
        for k in kept:
            k.stop()
        raise Interrupted(_kept_line(kept)) from None
    if any(isinstance(result, KeyboardInterrupt) for result in results):
        raise Interrupted(_kept_line(kept))
    for i, result in enumerate(results):
        if failed is not None and isinstance(result, OrchError):
            failed(i, result)
            results[i] = None
        elif isinstance(result, BaseException):
            raise result
    return results


def _kept_line(kept: list[Kept]) -> str:
    return "; ".join(k.words() for k in kept) + "; submit again to send the rest"


def send(remote: Remote, project: str, root: Path, plan: SyncPlan,
         progress: Callable[[int], None] | None = None, kept: Kept | None = None) -> dict[str, Any]:
    """Stream the plan's files as one tar to ``agent receive``; return its summary.

    A file changed, truncated or deleted while it was being sent is sent again as it is
    then (up to ``SEND_ROUNDS`` rounds; a file that keeps changing is a ``UsageError``
    naming it), as is one the server refused to join to its partial (``again``). The server
    records the hash of what it received, never a hash it lacks. ``kept`` hears what the
    server holds as it goes.

    With ``plan.stage`` the last round sets this tree apart on the server (``stage.py`` there;
    also when nothing needs sending): a file another sync replaced meanwhile comes back in the
    reply and is sent again like a changed one; one that keeps differing is a ``RemoteError``.
    The tree goes as its digest; a server whose own selection is another tree (a sync moved
    its record since this plan) answers ``stale`` and the next round, one more, sends the tree."""
    if plan.noop and plan.stage is None:
        return {"written": 0, "deleted": 0, "bytes": 0}
    kept = kept or Kept(remote.host.name)
    total: dict[str, Any] = {}
    rounds = SEND_ROUNDS
    while rounds:
        rounds -= 1
        value, changed = _send_once(remote, project, root, plan, progress, kept)
        kept.round_done(value["written"])
        differ, stale = _differ(remote, value, plan) if plan.stage is not None else ([], False)
        if stale:  # the round that only learned the tree must be sent does not count
            rounds += 1
        if plan.base is not None:
            recorded = synccache.after_receive(remote.host, project, plan.recorded, value)
        else:  # every entry was sent: the next hello brings the record whole
            recorded = None
            synccache.store(remote.host, project, None, {})
        for key, number in value.items():
            if key not in ("changes", "again", "stage"):
                total[key] = total.get(key, 0) + number if isinstance(number, int) else number
        changed += [rel for rel in value.get("again", []) if isinstance(rel, str) and rel in plan.entries
                    and rel not in changed]
        if not changed and not differ and not stale:
            return total
        plan = _replan(root, plan, sorted(set(changed) | set(differ)), value["generation"], recorded, stale)
    if not changed:
        raise RemoteError(f"{remote.host.name}: another sync of this workspace kept replacing {few(differ)} while "
                          "this submit set its code apart")
    raise UsageError(f"these files kept changing while they were sent: {few(changed)} — is a program writing "
                     "them? Stop it, or leave them out of the sync in .orchignore")


def _differ(remote: Remote, value: dict[str, Any], plan: SyncPlan) -> tuple[list[str], bool]:
    """The files the server could not stage as this submit sent them (``stage.py`` there),
    and whether it needs the tree itself (``stale``: asked once, for a digest); ``RemoteError``
    for an answer that is neither staged nor one of those (untrusted)."""
    answer = value.get("stage")
    if isinstance(answer, dict) and isinstance(answer.get("staged"), int):
        return [], False
    if isinstance(answer, dict) and answer.get("stale") is True and not plan.stage_tree:
        return [], True
    differ = answer.get("differ") if isinstance(answer, dict) else None
    if not isinstance(differ, list) or not differ or not all(isinstance(p, str) and p in plan.entries for p in differ):
        raise RemoteError(f"{remote.host.name}: orch's helper answered the sync without staging this submit's code")
    return differ, False


def _send_once(remote: Remote, project: str, root: Path, plan: SyncPlan,
               progress: Callable[[int], None] | None, kept: Kept) -> tuple[dict[str, Any], list[str]]:
    t0 = trace.since_start_ms()
    proc = remote.start("receive", project=project, stall_s=settings.LEASE_STALL.seconds())
    kept.call = proc
    pause("sync-stream")  # tests: the receiver holds the workspace's lock and waits for the stream
    outcome: dict[str, Any] = {}

    def produce() -> None:
        try:
            outcome["changed"] = _write_stream(proc, root, plan, progress)
        except BaseException as exc:  # reported below, after the remote side ends; never printed here
            outcome["error"] = exc
            try:
                proc.kill()
            except BaseException:  # noqa: BLE001 - the link may be gone already
                pass

    writer = threading.Thread(target=produce, daemon=True, name="orch-sync-writer")
    writer.start()
    try:
        while chunk := proc.read(1 << 16):  # what the server holds so far, until its reply
            kept.hear(chunk)
        value = remote.finish(proc, "sync")
    except KeyboardInterrupt:
        kept.stop()  # at once: the writer may be blocked on a slow link, never wait for it
        raise
    except BaseException:
        writer.join(timeout=30)
        _raise_local(outcome.get("error"))  # the laptop's own problem explains the broken stream
        raise
    finally:
        kept.call = None
    writer.join()
    _raise_local(outcome.get("error"))
    if "error" in outcome:
        raise outcome["error"]
    if trace.ON:
        stage = value.get("stage")
        trace.mark("send", f"{remote.host.name}: {len(plan.send)} file(s), {plan.send_bytes / 1e6:.1f} MB, "
                   f"{len(plan.delete)} deleted in {trace.since_start_ms() - t0:.0f} ms"
                   + (f"; tree {'sent whole' if plan.stage_tree else 'by digest'}, staged: {json.dumps(stage)[:60]}"
                      if stage is not None else ""))
    return value, outcome.get("changed", [])


def _raise_local(exc: BaseException | None) -> None:
    """Re-raise a laptop-side failure of the writer (a file it could not read) as itself."""
    if isinstance(exc, UsageError):
        raise exc
    if isinstance(exc, OSError) and exc.filename:
        raise UsageError(f"cannot read {exc.filename} ({exc.strerror or exc}) while syncing: fix it, or leave "
                         "it out of the sync in .orchignore") from None


def pull(remote: Remote, project: str, root: Path, paths: list[str]) -> list[str]:
    """Copy ``paths`` (files orch synced, since edited on the server) from the host's
    workspace into the local one, each written to a temporary and renamed into place."""
    requests = [{"path": p, "offset": 0} for p in paths]
    proc = remote.start("send_ws", project=project, files=requests)
    stream = FileStream(proc)
    base = os.path.realpath(root)
    for req in requests:
        header = stream.header()
        size = header.get("size")
        target = os.path.realpath(os.path.join(base, req["path"]))
        if header.get("path") != req["path"] or not isinstance(size, int) or size < 0 \
                or not target.startswith(base + os.sep):
            raise RemoteError(f"{remote.host.name}: unexpected file header {ascii(header)[:200]}")
        tmp = Path(target).with_name(temp_name(Path(target).name))  # fits wherever the name fits
        with open(tmp, "wb") as f:
            remaining = size
            while remaining:
                data = stream.take(min(remaining, 1 << 20))
                f.write(data)
                remaining -= len(data)
        os.replace(tmp, target)
    if stream.header() != {"end": True}:
        raise RemoteError(f"{remote.host.name}: the file stream did not end cleanly")
    remote.finish(proc, "bringing back edited files")
    return paths


def sync(remote: Remote, root: Path, exclude: list[str], state: dict[str, Any], force: bool = False) -> tuple[SyncPlan, dict[str, Any]]:
    """Sync ``root`` to the host's workspace for its project; ``state`` is hello's ``sync``."""
    files = select_files(root, exclude)
    plan = plan_sync(root, files, state, force)
    summary = send(remote, project_name(root), root, plan)
    return plan, summary

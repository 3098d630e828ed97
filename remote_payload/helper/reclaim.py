"""What orch keeps on a server, measured (``usage``: ``orch hosts check``) and reclaimed
(``collect``: ``orch gc``, ``orch rm``). Standard library only, Python >= 3.8.

The classes (``CLASSES``), each under the host's root:

- ``job``: a finished job's folder ``jobs/<id>/`` — terminal (succeeded, failed, cancelled) as
  ``Agent.probe`` decides it, no live supervisor (it may still write its records, or wait for a
  fetch) and no surviving process of its tree; and, for ``orch gc``, one the laptop fetched and
  verified (``fetched``) unless ``all_finished``, not among the ``keep`` newest finished jobs of
  its workspace (job.json's ``project``) and ended over ``keep_days`` ago. A queued, running,
  pending, lost or unknown job's folder is never one.
- ``payload``: ``payload/<hash>/`` of another orch version that no process on this host runs
  from or names (``/proc/*/cmdline`` and ``environ``: helpers, supervisors, jobs) and no Slurm
  job's ``slurm.sh`` names; never this helper's own. Without ``/proc`` none is.
- ``workspace``: ``workspace/<project>/`` with its sync record, last synced over ``keep_days``
  ago, not one of ``projects`` (the laptop's current checkout), no unfinished job's, and its
  lease (``helper/workspace.py``: ``record_lock``) free — taken while it is set aside, so no
  sync runs into it. The lock file itself stays (a lock file removed under a waiter would let
  two holders in).
- ``superseded``: ``jobs/.superseded/<id>-<time>/`` (a moved job's earlier attempt,
  ``move/job.py``: ``set_aside``) set aside over ``keep_days`` ago.
- ``staged``: ``staged/<token>/`` no launch took within ``stage.STALE_S``.
- ``temporary``: an interrupted gc's trash (``.gc-<pid>-…`` of a pid that is no helper now),
  ``.tmp-*`` folders of launches, payload installs and stagings older than ``TEMP_S``, a
  move's staging ``jobs/.move-<id>/`` untouched for ``keep_days`` whose lease is free, and
  move keys (``.orch-move-keys/``) older than ``TEMP_S``.

Every decision is made under the host's jobs lock (the one ``launch``, ``resume``, ``cancel``,
``adopt`` and ``fence`` hold), so a job that starts while gc runs is either seen by it (and
kept) or starts after its folder decisions are done. Removing is crash-safe: each chosen folder
is first renamed, under the lock, to a trash name in its own parent (``.gc-<pid>-<name>``: a
dot name, which no request reads as a job, a payload or a workspace), and only deleted once the
lock is released; a gc cut off midway leaves trash, never a half-deleted folder under a live
name, and the next gc deletes that trash. A payload is checked for users once more after its
rename and put back when one appeared.

Sizes are the bytes that removing frees: a file counts only when every hard link to it is among
what is removed (a job's ``code/`` shares its files with the workspace it was synced from), once,
for the first item that holds it. A dry run reports what the same call would remove.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from remote_payload.contract.jobfolder import read_json
from remote_payload.contract.protocol import TERMINAL
from remote_payload.helper import stage, workspace
from remote_payload.jobdir import lease
from remote_payload.jobdir.processes import pid_alive
from remote_payload.jobdir.status import read_status, survivors_of

CLASSES = ("job", "payload", "workspace", "superseded", "staged", "temporary")
TRASH = ".gc-"
TEMP_S = 3600.0  # a temporary older than this has no live writer (launches, installs and stagings take seconds)
DAY_S = 86400.0
SUPERSEDED_DIR = ".superseded"  # move/job.py's SUPERSEDED_DIR (move is a layer above the helper's modules)
MOVE_STAGE = ".move-"  # move/job.py's STAGE_PREFIX
MOVE_KEYS = ".orch-move-keys"  # move/pull.py's KEYS
_HASH = re.compile(rb"payload/([0-9a-f]{16})(?![0-9a-f])")
_BARE_HASH = re.compile(rb"^[0-9a-f]{16}$")


class Sizes:
    """Bytes freed per item: an inode counts once every one of its links was seen (module docstring)."""

    def __init__(self) -> None:
        self.inodes: Dict[Tuple[int, int], List[int]] = {}  # (dev, ino) -> [size, nlink, seen, first item]

    def walk(self, item: int, path: str) -> None:
        for top, dirs, files in os.walk(path):
            for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
                self._add(item, os.path.join(top, name))
        if os.path.islink(path) or os.path.isfile(path):
            self._add(item, path)

    def _add(self, item: int, path: str) -> None:
        try:
            st = os.lstat(path)
        except OSError:
            return
        seen = self.inodes.setdefault((st.st_dev, st.st_ino), [st.st_size, st.st_nlink, 0, item])
        seen[2] += 1

    def freed(self, items: int) -> List[int]:
        out = [0] * items
        for size, nlink, seen, item in self.inodes.values():
            if seen >= nlink:
                out[item] += size
        return out


def _names(folder: str) -> List[str]:
    try:
        return sorted(os.listdir(folder))
    except OSError:
        return []


def _age(path: str, now: float) -> float:
    try:
        return now - os.lstat(path).st_mtime
    except OSError:
        return 0.0


def payloads_in_use() -> Optional[Set[str]]:
    """The payload hashes any process of this host names (its command line or environment:
    ``payload/<hash>``, or a bare hash argument as BOOT takes it); None without ``/proc``."""
    if not os.path.isdir("/proc/self"):
        return None
    found: Set[str] = set()
    for pid in _names("/proc"):
        if not pid.isdigit():
            continue
        for part in ("cmdline", "environ"):
            try:
                with open(os.path.join("/proc", pid, part), "rb") as f:
                    data = f.read(1 << 20)
            except OSError:
                continue
            found.update(m.group(1).decode() for m in _HASH.finditer(data))
            if part == "cmdline":
                found.update(a.decode() for a in data.split(b"\0") if _BARE_HASH.match(a))
    return found


def _trash_owner_alive(name: str) -> bool:
    """A ``.gc-<pid>-…`` name whose gc is still deleting it (a live helper with that pid)."""
    pid = name[len(TRASH):].split("-", 1)[0]  # this helper's own: an earlier process's (a reused pid), or done
    return pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid), lease.HELPER_MARK)


class Collector:
    """One gc over ``root``: ``find`` the items (under the jobs lock), then ``remove`` them."""

    def __init__(self, root: str, payload_dir: str, probe: Callable[[str], Dict[str, Any]]) -> None:
        self.root, self.payload_dir, self.probe = root, payload_dir, probe
        self.items: List[Dict[str, Any]] = []
        self.kept: Dict[str, int] = {}
        self.refused: List[Dict[str, str]] = []
        self.missing: List[str] = []
        self.guards: Dict[str, Any] = {}  # item name -> what must be held while it is set aside (a workspace's lease)
        self.now = time.time()

    def keep(self, why: str) -> None:
        self.kept[why] = self.kept.get(why, 0) + 1

    def add(self, kind: str, rel: str, note: str, extra: Optional[Dict[str, Any]] = None) -> None:
        self.items.append(dict({"kind": kind, "name": rel, "bytes": 0, "note": note}, **(extra or {})))

    # -- jobs -----------------------------------------------------------------------------
    def _job_facts(self) -> Tuple[List[Dict[str, Any]], Set[str], Set[str]]:
        """Every job folder's facts; the projects of unfinished jobs; payload hashes Slurm scripts name."""
        jobs, busy_projects, slurm_payloads = [], set(), set()
        base = os.path.join(self.root, "jobs")
        for name in _names(base):
            d = os.path.join(base, name)
            if name.startswith(".") or not os.path.isdir(d) or os.path.islink(d):
                continue
            job = read_json(os.path.join(d, "job.json"))
            job = job if isinstance(job, dict) else {}
            project = str(job.get("project") or "")
            try:
                with open(os.path.join(d, "slurm.sh"), "rb") as f:
                    slurm_payloads.update(m.group(1).decode() for m in _HASH.finditer(f.read(1 << 20)))
            except OSError:
                pass
            try:
                st = self.probe(name)
            except Exception as exc:  # noqa: BLE001 - a job's own files are untrusted input
                st = {"state": "unknown", "reason": "%s: %s" % (type(exc).__name__, exc)}
            if st.get("state") not in TERMINAL:
                busy_projects.add(project)
            jobs.append({"id": name, "dir": d, "project": project, "status": st})
        return jobs, busy_projects, slurm_payloads

    def _finished_why_not(self, job: Dict[str, Any]) -> Optional[str]:
        """Why this job's folder must stay whatever the rule says; None when it may go."""
        st = job["status"]
        if st.get("state") not in TERMINAL:
            return "unfinished (%s)" % st.get("state")
        raw = read_status(os.path.join(job["dir"], "status.json")) or {}
        if pid_alive(int(raw.get("supervisor_pid") or 0), "supervisor"):
            return "its supervisor still runs (records, or waiting for a fetch)"
        if survivors_of(raw):
            return "processes of it still run"
        return None

    def find_jobs(self, jobs: List[Dict[str, Any]], fetched: Set[str], all_finished: bool, keep: int,
                  keep_days: float) -> None:
        finished: Dict[str, List[Tuple[float, Dict[str, Any]]]] = {}
        for job in jobs:
            why = self._finished_why_not(job)
            if why is not None:
                self.keep("unfinished" if why.startswith("unfinished") else "finishing")
                continue
            ended = job["status"].get("ended")
            if not isinstance(ended, (int, float)) or isinstance(ended, bool):
                ended = self.now - _age(os.path.join(job["dir"], "status.json"), self.now)
            finished.setdefault(job["project"], []).append((float(ended), job))
        for group in finished.values():
            group.sort(key=lambda pair: -pair[0])
            for n, (ended, job) in enumerate(group):
                if n < keep or self.now - ended < keep_days * DAY_S:
                    self.keep("retention")
                elif job["id"] not in fetched and not all_finished:
                    self.keep("not fetched")
                else:
                    self.add("job", "jobs/" + job["id"],
                             "%s%s, ended" % (job["status"].get("state"), ", fetched" if job["id"] in fetched else ""),
                             {"status": job["status"], "at": ended})

    def find_named(self, names: List[str], jobs: List[Dict[str, Any]]) -> None:
        """``orch rm``: exactly these jobs, whatever the rule; each refused with why, or missing."""
        by_id = {job["id"]: job for job in jobs}
        for name in names:
            job = by_id.get(name)
            if job is None:
                self.missing.append(name)
                continue
            why = self._finished_why_not(job)
            if why is not None:
                self.refused.append({"name": name, "why": why})
            else:
                self.add("job", "jobs/" + name, str(job["status"].get("state")), {"status": job["status"]})

    # -- the other classes ------------------------------------------------------------------
    def find_payloads(self, slurm_payloads: Set[str]) -> None:
        used = payloads_in_use()
        own = os.path.basename(os.path.normpath(self.payload_dir))
        names = [n for n in _names(os.path.join(self.root, "payload")) if not n.startswith(".") and n != own]
        if used is None:
            if names:
                self.keep("payload (no /proc to see who runs it)")
            return
        for name in names:
            if name in used or name in slurm_payloads:
                self.keep("payload in use")
            else:
                self.add("payload", "payload/" + name, "another orch version's helper and supervisor")

    def find_workspaces(self, projects: Set[str], busy_projects: Set[str], keep_days: float) -> None:
        state = os.path.join(self.root, "state")
        names = {n[len("sync-"):-len(".json")] for n in _names(state)
                 if n.startswith("sync-") and n.endswith(".json") and not n.endswith(".pending.json")}
        names.update(n for n in _names(os.path.join(self.root, "workspace")) if not n.startswith("."))
        for name in sorted(names):
            try:
                folder = workspace.workspace_dir(self.root, name)
            except workspace.SyncError:
                continue
            record = os.path.join(state, "sync-%s.json" % name)
            synced = self.now - min(_age(record, self.now) if os.path.exists(record) else float("inf"),
                                    _age(folder, self.now) if os.path.exists(folder) else float("inf"))
            if name in projects:
                self.keep("workspace of this checkout")
            elif name in busy_projects:
                self.keep("workspace of an unfinished job")
            elif self.now - synced < keep_days * DAY_S:
                self.keep("retention")
            elif lease.holder(workspace.record_lock(self.root, name)) is not None:
                self.keep("workspace a sync holds")
            else:
                self.add("workspace", "workspace/" + name, "last synced", {"at": synced})

    def find_superseded(self, keep_days: float) -> None:
        base = os.path.join(self.root, "jobs", SUPERSEDED_DIR)
        for name in _names(base):
            if name.startswith("."):
                continue
            if _age(os.path.join(base, name), self.now) < keep_days * DAY_S:
                self.keep("retention")
            else:
                self.add("superseded", "jobs/%s/%s" % (SUPERSEDED_DIR, name), "an earlier attempt of a moved job")

    def find_staged(self) -> None:
        for name in _names(os.path.join(self.root, "staged")):
            if not name.startswith(".") and _age(os.path.join(self.root, "staged", name), self.now) > stage.STALE_S:
                self.add("staged", "staged/" + name, "code a submit set apart that no launch took")

    def find_temporaries(self, keep_days: float) -> None:
        for folder in ("jobs", "payload", "staged", "workspace", "state", "jobs/" + SUPERSEDED_DIR):
            for name in _names(os.path.join(self.root, folder)):
                path = os.path.join(self.root, folder, name)
                rel = "%s/%s" % (folder, name)
                if name.startswith(TRASH) and not _trash_owner_alive(name):
                    self.add("temporary", rel, "left by an interrupted gc")
                elif name.startswith(".tmp-") and _age(path, self.now) > TEMP_S:
                    self.add("temporary", rel, "an interrupted launch, install or staging")
                elif folder == "jobs" and name.startswith(MOVE_STAGE) and _age(path, self.now) > keep_days * DAY_S \
                        and lease.holder(os.path.join(path, ".lock")) is None:
                    self.add("temporary", rel, "a move's staging, untouched since", {"at": self.now - _age(path, self.now)})
        for name in _names(os.path.join(self.root, MOVE_KEYS)):
            if _age(os.path.join(self.root, MOVE_KEYS, name), self.now) > TEMP_S:
                self.add("temporary", "%s/%s" % (MOVE_KEYS, name), "a move's key")

    # -- sizes and removal ------------------------------------------------------------------
    def measure(self) -> None:
        sizes = Sizes()
        for n, item in enumerate(self.items):
            sizes.walk(n, os.path.join(self.root, item["name"]))
            if item["kind"] == "workspace":
                for path in _record_files(self.root, item["name"].split("/", 1)[1]):
                    sizes.walk(n, path)
        for item, freed in zip(self.items, sizes.freed(len(self.items))):
            item["bytes"] = freed

    def set_aside(self) -> List[Tuple[Dict[str, Any], List[str]]]:
        """Rename each item to its trash name; the items set aside with their trash paths.
        Called under the jobs lock; a workspace under its own lease too."""
        done: List[Tuple[Dict[str, Any], List[str]]] = []
        for item in self.items:
            path = os.path.join(self.root, item["name"])
            if item["kind"] == "workspace":
                trashed = self._set_aside_workspace(item["name"].split("/", 1)[1])
            else:
                trashed = [t for t in [_to_trash(path)] if t is not None]
            if trashed and item["kind"] == "payload":
                again = payloads_in_use()
                if again is None or os.path.basename(path) in again:  # a helper of that version started meanwhile
                    os.rename(trashed[0], path)
                    trashed = []
            if trashed:
                done.append((item, trashed))
        return done

    def _set_aside_workspace(self, name: str) -> List[str]:
        try:
            held = lease.acquire(workspace.record_lock(self.root, name), "gc " + name, max_wait_s=0)
        except (lease.LeaseBusy, OSError):
            return []  # a sync took it since: it stays
        try:
            trashed = [t for t in (_to_trash(p) for p in [workspace.workspace_dir(self.root, name),
                                                          *_record_files(self.root, name)]) if t is not None]
        finally:
            held.release()
        return trashed


def _record_files(root: str, name: str) -> List[str]:
    """The sync record files of workspace ``name`` that exist (never its lock file)."""
    state = os.path.join(root, "state")
    return [p for p in (os.path.join(state, "sync-%s.json" % name), os.path.join(state, "sync-%s.pending.json" % name))
            if os.path.lexists(p)]


def _to_trash(path: str) -> Optional[str]:
    """``path`` renamed to ``.gc-<pid>-<name>`` beside it; None when it is gone already."""
    name = os.path.basename(path)
    if name.startswith(TRASH):
        return path if os.path.lexists(path) else None
    target = os.path.join(os.path.dirname(path), "%s%d-%s" % (TRASH, os.getpid(), name[-200:]))
    n = 1
    while os.path.lexists(target):  # an earlier gc of a process with this pid left one of that name
        n += 1
        target = os.path.join(os.path.dirname(path), "%s%d-%d-%s" % (TRASH, os.getpid(), n, name[-200:]))
    try:
        os.rename(path, target)
    except FileNotFoundError:
        return None
    return target


def _delete(paths: Iterable[str]) -> None:
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


def collect(root: str, payload_dir: str, probe: Callable[[str], Dict[str, Any]], args: Dict[str, Any],
            lock_wait_s: float) -> Dict[str, Any]:
    """The ``gc`` request (``contract/protocol.py``): find what the rule lets go (or, with
    ``jobs``, exactly those jobs: ``orch rm``), under the jobs lock; with ``dry_run`` only say
    it, else set each aside (of ``only``, the listing a person confirmed, when given), release
    the lock, and delete. Reply: ``items`` (kind, name under the root, bytes freed, note; ``at``:
    when a job ended, a workspace was last synced; a job's probed ``status``), ``kept`` (counts by reason), ``refused`` and ``missing`` (``jobs``)."""
    gc = Collector(root, payload_dir, probe)
    os.makedirs(root, exist_ok=True)
    held = lease.acquire(os.path.join(root, ".lock"), "gc jobs", stall_s=lock_wait_s, max_wait_s=lock_wait_s)
    try:
        jobs, busy_projects, slurm_payloads = gc._job_facts()
        if args["jobs"] is not None:
            gc.find_named([str(j) for j in args["jobs"]], jobs)
        else:
            days = float(args["keep_days"])
            gc.find_jobs(jobs, {str(j) for j in args["fetched"]}, bool(args["all_finished"]), int(args["keep"]), days)
            gc.find_payloads(slurm_payloads)
            gc.find_workspaces({str(p) for p in args["projects"]}, busy_projects, days)
            gc.find_superseded(days)
            gc.find_staged()
            gc.find_temporaries(days)
        if args["only"] is not None:
            only = {str(n) for n in args["only"]}
            gc.items = [item for item in gc.items if item["name"] in only]
        gc.measure()
        if args["dry_run"]:
            return {"items": gc.items, "kept": gc.kept, "refused": gc.refused, "missing": gc.missing,
                    "removed": False}
        done = gc.set_aside()
    finally:
        held.release()
    for _, trashed in done:
        _delete(trashed)
    return {"items": [item for item, _ in done], "kept": gc.kept, "refused": gc.refused, "missing": gc.missing,
            "removed": True}


# -- orch hosts check: what orch keeps here, by class ------------------------------------------
def usage(root: str, payload_dir: str) -> Dict[str, Any]:
    """Bytes and count per class of what orch keeps under ``root`` (a file with several links
    counts once, for the first class that holds it), and the data disk's size and use."""
    seen: Set[Tuple[int, int]] = set()
    out: Dict[str, List[int]] = {}

    def count(kind: str, path: str) -> None:
        total = 0
        for top, dirs, files in os.walk(path):
            for name in files:
                try:
                    st = os.lstat(os.path.join(top, name))
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
        if os.path.isfile(path) and not os.path.islink(path):
            st = os.lstat(path)
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
        row = out.setdefault(kind, [0, 0])
        row[0] += total
        row[1] += 1

    own = os.path.basename(os.path.normpath(payload_dir))
    for name in _names(os.path.join(root, "workspace")):
        count("workspace" if not name.startswith(".") else "temporary", os.path.join(root, "workspace", name))
    for name in _names(os.path.join(root, "jobs")):
        path = os.path.join(root, "jobs", name)
        if name == SUPERSEDED_DIR:
            for old in _names(path):
                count("superseded" if not old.startswith(".") else "temporary", os.path.join(path, old))
        elif name.startswith("."):
            if os.path.isdir(path):
                count("temporary", path)
        else:
            state = (read_status(os.path.join(path, "status.json")) or {}).get("state")
            count("finished job" if state in TERMINAL else "unfinished job", path)
    for name in _names(os.path.join(root, "payload")):
        kind = "temporary" if name.startswith(".") else "payload (this orch)" if name == own else "payload"
        count(kind, os.path.join(root, "payload", name))
    for name in _names(os.path.join(root, "staged")):
        count("temporary" if name.startswith(".") else "staged", os.path.join(root, "staged", name))
    for name in _names(os.path.join(root, MOVE_KEYS)):
        count("temporary", os.path.join(root, MOVE_KEYS, name))
    for name in ("state", "queue"):
        count("records", os.path.join(root, name))
    try:
        vfs = os.statvfs(root)
        disk = {"total_bytes": vfs.f_blocks * vfs.f_frsize, "free_bytes": vfs.f_bavail * vfs.f_frsize,
                "used_bytes": (vfs.f_blocks - vfs.f_bavail) * vfs.f_frsize}  # what orch cannot write to
    except OSError:
        disk = {}
    return {"classes": {kind: {"bytes": row[0], "count": row[1]} for kind, row in out.items()}, "disk": disk}

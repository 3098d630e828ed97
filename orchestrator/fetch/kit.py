"""What a move carries, gathered from a job's nodes, and the laptop's copy of it (the kit).

``gather`` asks every reachable node for its ``move_list`` and merges them: the files of the
node holding the newest complete checkpoint (the built-in trainer's rank 0 writes them), plus
the other nodes' own logs. The kit, ``runs/<job_id>/.orch-job/``, mirrors that set on the
laptop so ``orch resume JOB --on HOST`` works when the job's server is gone: ``move.json``
names every file (size, sha256, mtime) and is written last, after each file it names was
verified; a file arrives as ``<path>.orch-part`` and is renamed only once its sha256 matches.
A file the laptop already fetched with the same content (``orch fetch`` writes the same
paths) is hard-linked, not downloaded again. ``orch fetch --watch`` calls ``keep``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from orchestrator.errors import RemoteError
from orchestrator.fetch.download import ChangedWhileFetching, NameNotWritable, receive_file
from orchestrator.fetch.manifest import BAD_CHARS, SHA_RE, Entry
from orchestrator.helper.remote import FileStream, Remote
from orchestrator.jobs.nodes import parallel
from remote_payload.contract.jobfolder import atomic_write_json, sha256_file
from remote_payload.contract.protocol import ACTIVE

KIT_DIR = ".orch-job"
RECORD = "move.json"
PART = ".orch-part"
_STEP = re.compile(r"^checkpoints/step-(\d+)$")


@dataclass(frozen=True)
class Gathered:
    """The merged listing: ``files`` (each with ``node``, the index of the remote that has it),
    the node the checkpoint comes from, the checkpoint, the attempt count, the job's state there,
    and what the move cannot carry (symlinks, inputs outside the job folder)."""

    files: list[dict[str, Any]]
    primary: int
    checkpoint: str | None
    attempt: int
    state: str
    links: list[str]
    outside: list[dict[str, Any]]

    def record(self, job_id: str, hosts: list[str]) -> dict[str, Any]:
        return {"job_id": job_id, "hosts": hosts, "checkpoint": self.checkpoint, "attempt": self.attempt,
                "state": self.state, "links": self.links, "outside": self.outside,
                "files": [{k: f[k] for k in ("path", "size", "sha256", "mtime_ns")} for f in self.files]}


def step_of(checkpoint: str | None) -> int:
    m = _STEP.match(checkpoint or "")
    return int(m.group(1)) if m else -1


def safe_path(rel: Any) -> bool:
    """A listing path that stays inside the folder it names a file of (listings are untrusted)."""
    return (isinstance(rel, str) and bool(rel) and not rel.startswith("/") and not BAD_CHARS.search(rel)
            and all(p not in ("", ".", "..") for p in rel.split("/")) and not rel.endswith(PART))


def checked_files(files: Any, where: str) -> list[dict[str, Any]]:
    """The listing's entries, each checked (path, size, sha256, mtime_ns); ``RemoteError`` if one is odd."""
    out = []
    for f in files if isinstance(files, list) else [None]:
        if not (isinstance(f, dict) and safe_path(f.get("path")) and isinstance(f.get("size"), int) and f["size"] >= 0
                and isinstance(f.get("sha256"), str) and SHA_RE.fullmatch(f["sha256"])
                and isinstance(f.get("mtime_ns"), int)):
            raise RemoteError(f"{where}: the move listing holds an odd entry {ascii(f)[:160]}")
        out.append(f)
    return out


def gather(remotes: list[Remote | None], job_id: str) -> Gathered:
    """The merged ``move_list`` of the job's nodes (``None`` for a node that cannot be asked);
    raises what the first asked node raises when none answers."""
    asked = [i for i, r in enumerate(remotes) if r is not None]
    listings = dict(zip(asked, parallel(lambda i: remotes[i].call("move_list", job=job_id, timeout=3600), asked)))
    for i, listing in listings.items():
        listing["files"] = checked_files(listing["files"], remotes[i].host.name)  # type: ignore[union-attr]
    primary = max(asked, key=lambda i: (step_of(listings[i]["checkpoint"]), -i))
    files = [dict(f, node=primary) for f in listings[primary]["files"]]
    taken = {f["path"] for f in files}
    for i in asked:
        for f in listings[i]["files"]:
            if f["path"].startswith("logs/") and f["path"] not in taken:
                files.append(dict(f, node=i))
                taken.add(f["path"])
    states = [listings[i]["state"] for i in asked]
    state = next((s for s in ACTIVE if s in states), states[0])  # the most active node's state
    main = listings[primary]
    return Gathered(files, primary, main["checkpoint"], max(listings[i]["attempt"] for i in asked), state,
                    [str(x)[:300] for x in main["links"]][:50], [o for o in main["outside"] if isinstance(o, dict)][:20])


def kit_dir(run_dir: Path) -> Path:
    return run_dir / KIT_DIR


def read_kit(run_dir: Path) -> dict[str, Any] | None:
    """The kit's ``move.json`` when it is there and readable, else None."""
    try:
        record = json.loads((kit_dir(run_dir) / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("files"), list) else None


def _present(path: Path, entry: dict[str, Any], known: dict[str, Any]) -> bool:
    """The kit file is there with the listed content: trusted from the last ``move.json``
    when its size and mtime are what that record says, else hashed."""
    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_size != entry["size"]:
        return False
    old = known.get(entry["path"])
    if old and old.get("sha256") == entry["sha256"] and st.st_mtime_ns == entry["mtime_ns"]:
        return True
    return sha256_file(str(path)) == entry["sha256"]


def keep(remotes: list[Remote], job_id: str, run_dir: Path, say: Callable[[str], None]) -> None:
    """Bring ``run_dir/.orch-job/`` up to date from the job's nodes (``remotes`` in host order).
    Never leaves a half file under a final name; raises ``HostError``/``RemoteError`` like a fetch.
    A file that changed on the server since it was listed (a log still growing) keeps its
    earlier copy until the next call."""
    gathered = gather(list(remotes), job_id)
    kit = kit_dir(run_dir)
    kit.mkdir(parents=True, exist_ok=True)
    known = {f.get("path"): f for f in (read_kit(run_dir) or {}).get("files", []) if isinstance(f, dict)}
    missing: dict[int, list[dict[str, Any]]] = {}
    for entry in gathered.files:
        target = kit / entry["path"]
        if _present(target, entry, known):
            continue
        fetched = run_dir / entry["path"]  # orch fetch's copy of the same path
        if fetched.is_file() and fetched.stat().st_size == entry["size"] and sha256_file(str(fetched)) == entry["sha256"]:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.unlink(missing_ok=True)
            os.link(fetched, target)
            os.utime(target, ns=(entry["mtime_ns"], entry["mtime_ns"]))
            continue
        missing.setdefault(entry["node"], []).append(entry)
    changed: set[str] = set()
    for node, entries in missing.items():
        changed |= _download(remotes[node], job_id, kit, entries)
    record = gathered.record(job_id, [r.host.name for r in remotes])
    listed = []  # a file that changed since it was listed keeps its earlier verified copy, if any
    for f in record["files"]:
        if f["path"] not in changed:
            listed.append(f)
        elif f["path"] in known and (kit / f["path"]).is_file():
            listed.append(known[f["path"]])
    record["files"] = listed
    atomic_write_json(str(kit / RECORD), record)  # names only verified files: written before pruning
    names = {f["path"] for f in listed}
    for path in sorted(kit.rglob("*"), reverse=True):  # what the server no longer lists (pruned checkpoints)
        rel = path.relative_to(kit).as_posix()
        if path.is_dir():
            if not any(path.iterdir()):
                path.rmdir()
        elif rel != RECORD and rel not in names:
            path.unlink()
    if missing:
        say(f"move kit: {sum(len(e) for e in missing.values()) - len(changed)} file(s) kept in {kit}")


def _download(remote: Remote, job_id: str, kit: Path, entries: list[dict[str, Any]]) -> set[str]:
    """Fetch ``entries`` into the kit, each verified; returns the paths that did not match
    their listing (changed since it was made)."""
    proc = remote.start("send", job=job_id, files=[{"path": e["path"], "offset": 0, "size": e["size"]}
                                                   for e in entries])
    stream = FileStream(proc)
    changed: set[str] = set()
    for entry in entries:
        header = stream.header()
        size = header.get("size")
        if header.get("path") != entry["path"] or not isinstance(size, int) or not 0 <= size <= entry["size"]:
            raise RemoteError(f"{remote.host.name}: unexpected file header {ascii(header)[:200]}")
        try:
            receive_file(stream, kit, Entry(entry["path"], entry["size"], entry["sha256"], entry["path"]), 0, size,
                         suffix=PART)
        except (ChangedWhileFetching, NameNotWritable):  # not kept (a name this laptop cannot hold: never)
            changed.add(entry["path"])
            continue
        os.utime(kit / entry["path"], ns=(entry["mtime_ns"], entry["mtime_ns"]))
    if stream.header() != {"end": True}:
        raise RemoteError(f"{remote.host.name}: the file stream did not end cleanly")
    remote.finish(proc, "copying the job's files")
    return changed

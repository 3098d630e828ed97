"""The laptop's copy of each host's sync record, so a sync sends changes, not the record.

``ORCH_HOME/sync/<key>.json`` = {"generation", "files"}: the record of one project on one
host as the server last described it (``remote_payload/helper/workspace.py``). ``hello`` asks with
the generation held here and gets the files only when the server's record is another one;
after a ``receive`` the server's ``changes`` are applied here, so the next ``hello`` of an
unchanged workspace carries a few hundred bytes instead of every file's entry. The copy is a
cache: unreadable or missing, it is simply not used (the server then sends the whole record).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from orchestrator.errors import RemoteError
from orchestrator.home import orch_home, write_private

if TYPE_CHECKING:
    from orchestrator.helper.remote import Remote
    from orchestrator.hosts.inventory import Host


def _path(host: "Host", project: str) -> Path:
    key = "\0".join([host.name, host.kind, host.address, str(host.port), host.user, host.root, project])
    return orch_home() / "sync" / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


def load(host: "Host", project: str) -> tuple[str, dict[str, Any]] | None:
    """(generation, files) held for ``project`` on ``host``; None when there is none."""
    try:
        data = json.loads(_path(host, project).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and isinstance(data.get("generation"), str) and isinstance(data.get("files"), dict):
        return data["generation"], data["files"]
    return None


def store(host: "Host", project: str, generation: str | None, files: dict[str, Any]) -> None:
    """Keep ``files`` as the record of ``generation`` (None: forget what is held)."""
    path = _path(host, project)
    if generation is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, json.dumps({"generation": generation, "files": files}))


def hello(remote: "Remote", project: str, gpus: bool = False, stage: str | None = None,
          unchanged: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
    """``hello`` for ``project``, its ``sync`` whole (files included) whether the server sent
    them or the laptop held them; what the server sent is kept for next time. A Slurm host's
    reply also describes the cluster (``slurm``).

    ``stage`` (a token) with ``unchanged``: when ``unchanged(files)`` says the laptop's selection
    is exactly the record held here (a resubmit with no change), the server is asked to set that
    record's tree apart under ``stage`` in this same round trip; ``sync["staged"]`` then holds its
    answer (``remote_payload/helper/stage.py``: ``from_record``)."""
    held = load(remote.host, project)
    ask = {"token": stage, "generation": held[0]} if stage and unchanged and held and unchanged(held[1]) else None
    reply = remote.call("hello", project=project, gpus=gpus, known=held[0] if held else None,
                        slurm=remote.host.hello_slurm, stage=ask)
    state = _checked(remote.host, project, reply.get("sync"))
    generation = state.get("generation")
    if state.get("same"):
        if held is None or held[0] != generation:  # cannot be, unless the copy changed meanwhile: ask in full
            store(remote.host, project, None, {})
            return hello(remote, project, gpus)
        return dict(reply, sync=dict(state, files=held[1]))
    files = state.get("files")
    if not isinstance(files, dict):
        raise RemoteError(f"{remote.host.name}: hello's sync state for {project} lists no files")
    store(remote.host, project, generation if isinstance(generation, str) else None, files)
    return reply


def _checked(host: "Host", project: str, state: Any) -> dict[str, Any]:
    """hello's sync state, its fields of the right types (untrusted server bytes)."""
    ok = isinstance(state, dict) \
        and all(isinstance(state.get(k, []), list) and all(isinstance(p, str) for p in state.get(k, []))
                for k in ("edited", "missing")) \
        and isinstance(state.get("files", {}), dict) and all(isinstance(e, dict) for e in state.get("files", {}).values()) \
        and isinstance(state.get("generation"), (str, type(None)))
    if not ok:
        raise RemoteError(f"{host.name}: orch's helper answered hello with a malformed sync state for {project}")
    return state


def after_receive(host: "Host", project: str, base: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any] | None:
    """The record now on the server: ``base`` (the record the sync was planned from) with the
    reply's ``changes`` applied, kept for next time. None (and nothing kept) when the reply
    carries no changes (the server's record had moved on, or the sync sent every entry)."""
    changes = reply.get("changes")
    if not isinstance(changes, dict):
        store(host, project, None, {})
        return None
    files = dict(base)
    for rel, entry in changes.items():
        if entry is None:
            files.pop(rel, None)
        elif isinstance(entry, dict):
            files[rel] = entry
    store(host, project, reply["generation"], files)
    return files

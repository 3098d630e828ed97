"""A finished job's log kept on the laptop: ``orch logs JOB`` of an ended job needs no host.

``ORCH_HOME/logs/<job_id>.log`` holds exactly what ``orch logs JOB`` printed (cleaned text, every
node merged with ``[node i]`` prefixes), and ``<job_id>.json`` the terminal status it was read
under (state and end time). It is written only when the whole log was read (from its first byte,
every node, to the end) while the job was terminal, and is at most ``MAX_CHARS``. It is used only
while the registry still records that same terminal state and end time: ``orch resume`` makes
the job active again, and its next end has another end time, so a resumed job's log is read
from the host again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from orchestrator.home import orch_home, write_private
from remote_payload.contract.protocol import TERMINAL

MAX_CHARS = 16 << 20


def _paths(job_id: str) -> tuple[Path, Path]:
    base = orch_home() / "logs"
    return base / f"{job_id}.log", base / f"{job_id}.json"


def _key(status: dict[str, Any]) -> dict[str, Any]:
    return {"state": status.get("state"), "ended": status.get("ended")}


def load(job_id: str, status: dict[str, Any]) -> str | None:
    """The kept log of ``job_id`` when ``status`` (the registry's) is the terminal status it
    was kept under; None otherwise."""
    if status.get("state") not in TERMINAL:
        return None
    text_path, meta_path = _paths(job_id)
    try:
        if json.loads(meta_path.read_text(encoding="utf-8")) != _key(status):
            return None
        return text_path.read_text(encoding="utf-8")
    except (OSError, ValueError):
        return None


def save(job_id: str, status: dict[str, Any], text: str) -> None:
    """Keep ``text`` as the whole log of ``job_id``, ended with ``status`` (terminal only)."""
    if status.get("state") not in TERMINAL or len(text) > MAX_CHARS:
        return
    text_path, meta_path = _paths(job_id)
    try:
        write_private(text_path, text)
        write_private(meta_path, json.dumps(_key(status)))
    except OSError:
        pass  # a cache: a full disk only means the next read asks the host


class Capture:
    """Wraps a ``write``: passes text on and keeps a copy up to ``MAX_CHARS``."""

    def __init__(self, write: Any) -> None:
        self.inner, self.parts, self.size = write, [], 0

    def __call__(self, text: str) -> None:
        self.inner(text)
        if self.size <= MAX_CHARS:
            self.parts.append(text)
            self.size += len(text)

    def text(self) -> str | None:
        return "".join(self.parts) if self.size <= MAX_CHARS else None

"""How a submit that did not start its job ended — interrupted or failed, and why — decided
in one place, for its error message and for what ``orch status`` says of its reservation.

Interrupted: the link was cut or stalled, a host stopped answering, Ctrl-C, the process was
killed (it left no word: its reservation is ``submitting`` with no submit holding it,
``state/inflight.py``). Running the same submit again finishes it. Failed: a remote step
refused (the disk is full, a name too long, permission denied, a helper error) or the input
is wrong; the message says what failed and why, and the same submit works once that is fixed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from orchestrator.errors import HostError, OrchError, RemoteError
from orchestrator.state import inflight
from orchestrator.state.registry import SUBMITTING, Registry

INTERRUPTED, FAILED = "interrupted", "failed"
# Causes a server's (or this laptop's) error text names, in words a person acts on.
CAUSES = (
    (re.compile(r"No space left on device|\[Errno 28\]"), "the disk is full"),
    (re.compile(r"Disk quota exceeded|\[Errno 122\]"), "the disk quota is used up"),
    (re.compile(r"File name too long|\[Errno 36\]"), "a file name is too long for that filesystem"),
    (re.compile(r"Read-only file system|\[Errno 30\]"), "the filesystem is read-only"),
    (re.compile(r"Permission denied|Operation not permitted|\[Errno 1[3]?\]"), "permission denied"),
)
STALLED = ("did not answer within",)  # a RemoteError that says nothing about the step's fate


@dataclass(frozen=True)
class Ending:
    """``kind`` (INTERRUPTED or FAILED), ``why`` (the cause's first line) and, for a cause
    orch recognises, ``cause`` in plain words."""

    kind: str
    why: str
    cause: str = ""
    launching: bool = False  # it stopped while the launch requests were out: some node may have started

    def as_detail(self) -> dict[str, Any]:
        return {"ended": self.kind, "why": self.why[:300], "cause": self.cause, "launching": self.launching}


def classify(exc: BaseException, launching: bool = False) -> Ending:
    """The one verdict on why a submit stopped (see the module docstring); ``launching``: it
    stopped after the launch requests went out."""
    if isinstance(exc, KeyboardInterrupt):
        return Ending(INTERRUPTED, "interrupted (Ctrl-C)", launching=launching)
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    cause = next((words for pattern, words in CAUSES if pattern.search(str(exc))), "")
    if isinstance(exc, HostError) or (isinstance(exc, RemoteError) and any(s in text for s in STALLED)):
        return Ending(INTERRUPTED, text, launching=launching)
    return Ending(FAILED, text, cause, launching)


class SubmitEnded(OrchError):
    """A submit that stopped before its job started, reserved as ``job_id``: the cause's
    message and exit code, then one line — interrupted: run the same submit again; failed:
    what failed and why, fix it and submit again."""

    def __init__(self, cause: OrchError, job_id: str, ending: Ending) -> None:
        self.cause, self.exit_code = cause, cause.exit_code
        because = f": {ending.cause}" if ending.cause else ""
        if ending.kind == INTERRUPTED:
            tail = (f"the submit was interrupted before {job_id} was confirmed started: run the same orch submit "
                    "again (it keeps that id and never starts the job twice)")
        elif ending.launching:  # a node may have started: say where to look, not "nothing"
            tail = (f"the submit failed while launching {job_id}{because}; orch status {job_id} shows what started: "
                    "fix that, then run the same orch submit again (no node starts twice)")
        else:
            tail = (f"the submit failed before {job_id} started{because}; nothing was started: fix that, then run "
                    "orch submit again")
        super().__init__(f"{cause}\n{tail}")


def recorded(registry: Registry, job_id: str, reserved: dict[str, Any], exc: BaseException,
             launching: bool) -> BaseException:
    """Keep how the submit that reserved ``job_id`` ended with its reservation (still
    ``submitting``: a rerun reuses the id) and return what to raise: an ``OrchError`` as
    ``SubmitEnded``, anything else (Ctrl-C, a bug) as it is."""
    ending = classify(exc, launching)
    registry.update(job_id, SUBMITTING, dict(reserved, submit=ending.as_detail()))
    return SubmitEnded(exc, job_id, ending) if isinstance(exc, OrchError) else exc


def reservation_reason(detail: dict[str, Any]) -> str:
    """What ``orch status`` says of a job still ``submitting`` that no host knows yet: being
    submitted (a live submit holds its key), failed (and why), or interrupted."""
    key = detail.get("submission")
    live = inflight.holder(key) if isinstance(key, str) and key else None
    if live is not None:
        return f"being submitted ({live.describe()})"
    ended = detail.get("submit") if isinstance(detail.get("submit"), dict) else {}
    if ended.get("ended") == FAILED:
        cause = str(ended.get("cause") or "")
        return (f"submit failed {'while launching' if ended.get('launching') else 'before launch'}"
                f"{': ' + cause if cause else ''} ({str(ended.get('why') or '?')[:200]}): fix it and run the same "
                "orch submit again")
    return "submit was interrupted before launch: run the same orch submit again"

"""The laptop <-> server protocol in one place: job states, the request table, the framing.

Shared by both sides (the laptop imports it from ``remote_payload``), so it is standard
library only and Python >= 3.8.

A session is one helper process on the server (``python -c BOOT ROOT HASH serve``) that
serves requests one after another until its stdin ends. It first writes ``MAGIC`` (a login
shell may print anything before it). Each message is a frame: one kind byte, a 4-byte
big-endian length, the payload.

- laptop -> server: ``Q`` {"op": name, "args": {...}}; then, for a request that reads a
  stream, ``D`` data frames and one ``E`` (end of input).
- server -> laptop: for a request that writes a stream, ``D`` data frames; then one ``R``
  reply: the reply object, or {"error": message} for a failure the user should read (so no
  reply object has a field named ``error``).

To add a request: a row in ``REQUESTS`` (its fields with types and defaults, its reply's
fields, whether it reads or writes a stream, whether it holds the jobs lock, where its reply
holds job statuses) and a handler of
the same name in ``remote_payload/helper/serve.py``. Both sides check arguments against the row;
the laptop checks every reply against it and rejects a malformed one naming the request.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import IO, Any, Dict, NamedTuple, Optional, Tuple

# -- job states --------------------------------------------------------------------------
PENDING, QUEUED, SETTING_UP, RUNNING = "pending", "queued", "setting_up", "running"
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
LOST, UNKNOWN = "lost", "unknown"
ACTIVE = (RUNNING, SETTING_UP, QUEUED, PENDING)  # most active first; queued: waiting for GPUs (remote_payload/gpuqueue/)
TERMINAL = (SUCCEEDED, FAILED, CANCELLED)       # written by a supervisor; never changes again
SETTLED = TERMINAL + (LOST, UNKNOWN)            # nothing more will happen without the user
RESUMABLE = (FAILED, LOST, CANCELLED)           # what ``orch resume`` accepts
STATES = ACTIVE + TERMINAL + (LOST, UNKNOWN)    # every state a server reports
GRACE_S = 30.0  # SIGTERM -> SIGKILL when a job is stopped, unless job.json says otherwise (grace_s)

# -- sync (remote_payload/helper/workspace.py: receive) ----------------------------------
# A file cut off mid-sync with at least this many bytes on the server is kept (under its
# temporary name) and the next sync sends only the rest of it; a smaller one is sent again.
RESUME_MIN_BYTES = 1 << 20


def tree_digest(tree: Dict[str, Any]) -> str:
    """The sha256 that names a submit's tree ``{rel: [sha256 or None, link or None]}``, the
    same on both sides: a receive that can make the tree itself (the record it holds with the
    stream's changes) checks it against the laptop's digest instead of being sent the tree."""
    text = json.dumps(sorted(tree.items()), separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()

# -- framing -----------------------------------------------------------------------------
MAGIC = b"\x00orch-serve-1\n"
HEADER = struct.Struct(">cI")
MAX_FRAME = 64 << 20
REQUEST, DATA, END, REPLY = b"Q", b"D", b"E", b"R"


class ProtocolError(Exception):
    """A frame, a request or a reply that does not follow this module."""


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def read_frame(stream: IO[bytes]) -> Optional[Tuple[bytes, bytes]]:
    """The next (kind, payload) from a blocking binary stream; None at a clean EOF."""
    head = _exactly(stream, HEADER.size, eof_ok=True)
    if head is None:
        return None
    kind, length = HEADER.unpack(head)
    if kind not in (REQUEST, DATA, END, REPLY) or length > MAX_FRAME:
        raise ProtocolError("garbled frame (kind %r, %d bytes)" % (kind, length))
    return kind, _exactly(stream, length) or b""


def _exactly(stream: IO[bytes], n: int, eof_ok: bool = False) -> Optional[bytes]:
    parts, got = [], 0
    while got < n:
        chunk = stream.read(n - got)
        if not chunk:
            if eof_ok and got == 0:
                return None
            raise ProtocolError("the stream ended inside a frame")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


# -- the request table ---------------------------------------------------------------------
REQUIRED = object()
NUMBER = (int, float)
Shape = Dict[str, Tuple[Any, Any]]   # field -> (type or tuple of types, default or REQUIRED)


class Request(NamedTuple):
    args: Shape
    reply: Shape                 # fields every reply has (REQUIRED) or may have (a default)
    reads: bool = False          # takes a byte stream (D frames up to E)
    writes: bool = False         # answers with a byte stream before its reply
    locked: bool = False         # runs under the host's jobs lock (launch, resume, cancel)
    statuses: str = ""           # where the reply holds job statuses (checked against JOB_STATUS and
    #                              STATES): "reply" itself, its "status" field, every value of "jobs"


OPT = None  # an optional reply field: checked when present
NONE = type(None)
MAYBE_NUMBER = (int, float, NONE)
JOB_STATUS: Shape = {  # a job's status.json as the server reports it (jobdir/status.py: read_status), plus probe's fields
    "state": (str, REQUIRED), "job_id": (str, OPT), "reason": ((str, NONE), OPT), "metrics": (dict, OPT),
    "exit_code": ((int, NONE), OPT), "node_rank": (int, OPT), "unsupervised": (bool, OPT),
    "survivors": (int, OPT), "attempt": (int, OPT), "heartbeat": (MAYBE_NUMBER, OPT),
    "started": (MAYBE_NUMBER, OPT), "ended": (MAYBE_NUMBER, OPT), "procs": (list, OPT),
    "log_nodes": (int, OPT), "slurm_job": (str, OPT),  # a Slurm job: its node logs, its latest Slurm job id
    "queue_position": ((int, NONE), OPT), "gpus": (list, OPT),  # queued: its place; then the GPUs it got
    "first_started": (MAYBE_NUMBER, OPT), "resumed_from_step": ((int, NONE), OPT),  # across attempts (orch resume)
    "resume_dropped": (str, OPT),  # resume_args left out (no checkpoint for {last_checkpoint}): why; supervisor/attempt.py
    # a live supervisor (jobdir/answering.py): its /proc state, its heartbeat's age, that age when it is not answering
    "supervisor_process": (str, OPT), "heartbeat_age_s": (NUMBER, OPT), "not_answering_s": (NUMBER, OPT),
}
JOB = {"job": (str, REQUIRED)}

REQUESTS: Dict[str, Request] = {
    "hello": Request({"project": ((str, NONE), None), "gpus": (bool, False), "known": ((str, NONE), None),
                      "slurm": ((dict, NONE), None),  # a Slurm login node: the env for Slurm's commands
                      "stage": ((dict, NONE), None)},  # {token, generation}: stage from the record (helper/stage.py)
                     {"python": (str, REQUIRED), "python_version": (str, REQUIRED), "root": (str, REQUIRED),
                      "boot_id": (str, REQUIRED), "hostname": (str, REQUIRED), "gpus": (int, OPT),
                      "sync": (dict, OPT), "payload": (str, OPT), "slurm": (dict, OPT)}),
    # receive: a tar stream in; out, a JSON line now and then saying what the server holds
    # ({"files", "bytes", "file", "have"}: files complete, and the bytes of the one being written)
    "receive": Request({"project": (str, REQUIRED), "stall_s": (NUMBER, REQUIRED)},
                       {"written": (int, REQUIRED), "deleted": (int, REQUIRED), "bytes": (int, REQUIRED),
                        "generation": (str, REQUIRED), "changes": (dict, OPT), "again": (list, OPT),
                        "stage": (dict, OPT)},  # stage: the submit's code set apart (helper/stage.py)
                       reads=True, writes=True),
    "launch": Request({"request": (dict, REQUIRED)},
                      {"existing": (bool, REQUIRED), "status": (dict, OPT), "pid": (int, OPT),
                       "job_dir": (str, OPT), "slurm_job": (str, OPT)}, locked=True, statuses="status"),
    "status": Request({"jobs": (list, REQUIRED)}, {"jobs": (dict, REQUIRED)}, statuses="jobs"),
    "cancel": Request({"job": (str, REQUIRED), "grace": (NUMBER, REQUIRED)}, JOB_STATUS, locked=True,
                      statuses="reply"),
    "resume": Request({"job": (str, REQUIRED), "whole_job": (bool, False), "secrets": (dict, None)},
                      {"pid": (int, OPT), "slurm_job": (str, OPT),
                       "note": (str, OPT)},  # what the attempt appends (supervisor/attempt.py plan), or why not
                      locked=True),
    "follow": Request({"job": (str, REQUIRED), "offset": (int, REQUIRED), "node": (int, REQUIRED),
                       "follow": (bool, REQUIRED), "heartbeat": (NUMBER, REQUIRED)}, {}, writes=True),
    "tail_offset": Request({"job": (str, REQUIRED), "node": (int, REQUIRED), "lines": (int, REQUIRED)},
                           {"offset": (int, REQUIRED)}),
    "manifest": Request(JOB, {"files": (list, REQUIRED), "state": (str, REQUIRED), "outputs": ((list, NONE), OPT),
                              "links": (list, OPT)}),  # the job folder's symlinks (jobdir/manifest.py describe_link)
    "send": Request({"job": (str, REQUIRED), "files": (list, REQUIRED)}, {}, writes=True),
    "send_ws": Request({"project": (str, REQUIRED), "files": (list, REQUIRED)}, {}, writes=True),
    "show": Request(JOB, {"status": (dict, REQUIRED)}, statuses="status"),
    "fetched": Request(JOB, {"ok": (bool, REQUIRED)}),
    "free_port": Request({}, {"port": (int, REQUIRED), "hostname": (str, REQUIRED)}),
    "listen": Request({"port": (int, REQUIRED), "seconds": (NUMBER, REQUIRED)}, {"ok": (bool, REQUIRED)},
                      reads=True, writes=True),
    "tcp_check": Request({"host": (str, REQUIRED), "port": (int, REQUIRED)},
                         {"ok": (bool, REQUIRED), "reason": (str, OPT), "seconds": (NUMBER, OPT)}),
    "preflight": Request({"torch_timeout": (NUMBER, 60.0),
                          "usage": (bool, False)},  # orch hosts check: orch's disk use by class (helper/reclaim.py)
                         {"root": (str, REQUIRED), "jobs": (list, OPT),  # its unfinished jobs' statuses
                          "usage": (dict, OPT)}),
    # moving a job (orch resume --on; remote_payload/move/job.py): the source's listing, the target's staging
    "move_list": Request(JOB, {"files": (list, REQUIRED), "checkpoint": ((str, NONE), REQUIRED),
                               "links": (list, REQUIRED), "outside": (list, REQUIRED), "attempt": (int, REQUIRED),
                               "state": (str, REQUIRED)}),
    "move_have": Request(JOB, {"exists": (bool, REQUIRED), "files": (dict, REQUIRED), "parts": (dict, REQUIRED),
                               "free": (int, REQUIRED)}),
    "move_receive": Request({"job": (str, REQUIRED), "files": (list, REQUIRED)},
                            {"written": (int, REQUIRED), "bytes": (int, REQUIRED)}, reads=True),
    "move_key": Request(JOB, {"public": (str, REQUIRED), "key": (str, REQUIRED)}),
    "move_pull": Request({"job": (str, REQUIRED), "key": (str, REQUIRED), "address": (str, REQUIRED),
                          "port": (int, REQUIRED), "user": (str, REQUIRED), "host_key": (str, REQUIRED),
                          "command": (str, REQUIRED), "files": (list, REQUIRED), "requests": (list, REQUIRED)},
                         {"written": (int, REQUIRED), "bytes": (int, REQUIRED)}),
    # the host's GPU queue (gpuqueue.view): GPUs with their holder, running and waiting jobs
    "queue": Request({}, {"gpus": (list, REQUIRED), "jobs": (list, REQUIRED), "source": (str, REQUIRED),
                          "seen": (MAYBE_NUMBER, OPT)}),
    "adopt": Request({"request": (dict, REQUIRED), "files": (list, REQUIRED), "moved": (dict, REQUIRED)},
                     {"existing": (bool, REQUIRED), "status": (dict, OPT), "pid": (int, OPT), "job_dir": (str, OPT),
                      "slurm_job": (str, OPT)}, locked=True, statuses="status"),
    # orch gc / orch rm (helper/reclaim.py): what the rule lets go, decided under the jobs lock, then removed
    "gc": Request({"dry_run": (bool, True), "keep_days": (NUMBER, REQUIRED), "keep": (int, REQUIRED),
                   "fetched": (list, REQUIRED), "all_finished": (bool, False), "projects": (list, REQUIRED),
                   "only": ((list, NONE), None), "jobs": ((list, NONE), None)},
                  {"items": (list, REQUIRED), "kept": (dict, REQUIRED), "refused": (list, REQUIRED),
                   "missing": (list, REQUIRED), "removed": (bool, REQUIRED)}),
    # the old host of a moved job (state/fences.py): stop the superseded attempt, set its folder aside
    "fence": Request({"job": (str, REQUIRED), "moved_to": (str, REQUIRED)},
                     {"found": (bool, REQUIRED), "state": (str, REQUIRED), "stopped": (bool, REQUIRED),
                      "kept": ((str, NONE), REQUIRED)}, locked=True),
}


def is_a(value: Any, types: Any) -> bool:
    if isinstance(value, bool):  # a bool is an int to isinstance; never take one for the other
        return bool in (types if isinstance(types, tuple) else (types,))
    return isinstance(value, types)


def _name(types: Any) -> str:
    return " or ".join(t.__name__ if t is not type(None) else "null" for t in (types if isinstance(types, tuple) else (types,)))


def check_args(op: str, args: Any) -> Dict[str, Any]:
    """``args`` for ``op`` with defaults filled in; ``ProtocolError`` naming the field when
    the op is unknown, a field is unknown or missing, or a value has the wrong type."""
    request = REQUESTS.get(op)
    if request is None:
        raise ProtocolError("unknown request %r" % (op,))
    if not isinstance(args, dict):
        raise ProtocolError("%s: arguments must be an object" % op)
    extra = sorted(set(args) - set(request.args))
    if extra:
        raise ProtocolError("%s: unknown argument %s" % (op, ", ".join(extra)))
    out: Dict[str, Any] = {}
    for field, (types, default) in request.args.items():
        if field not in args:
            if default is REQUIRED:
                raise ProtocolError("%s: missing argument %s" % (op, field))
            out[field] = default
        elif not is_a(args[field], types):
            raise ProtocolError("%s: argument %s must be %s" % (op, field, _name(types)))
        else:
            out[field] = args[field]
    return out


def check_shape(what: str, value: Any, shape: Shape) -> Dict[str, Any]:
    """``value`` if it is an object whose fields in ``shape`` are there (when REQUIRED) and of
    their type (when present); ``ProtocolError`` naming the first field that is not."""
    if not isinstance(value, dict):
        raise ProtocolError("%s is not an object" % what)
    for field, (types, default) in shape.items():
        if field not in value:
            if default is REQUIRED:
                raise ProtocolError("%s lacks %r" % (what, field))
        elif not is_a(value[field], types):
            raise ProtocolError("%s: %r is not %s" % (what, field, _name(types)))
    return value


def check_reply(op: str, value: Any) -> Dict[str, Any]:
    """A reply to ``op`` checked against its row (an ``error`` reply passes as it is)."""
    if isinstance(value, dict) and "error" in value:
        return value
    request = REQUESTS[op]
    check_shape("the reply to %s" % op, value, request.reply)
    if request.statuses == "jobs":
        for job, status in value["jobs"].items():
            check_job_status("the status of %s" % job, status)
    elif request.statuses == "status" and "status" in value:
        check_job_status("the reply's status", value["status"])
    elif request.statuses == "reply":
        check_job_status("the reply to %s" % op, value)
    return value


def check_job_status(what: str, status: Any) -> Dict[str, Any]:
    check_shape(what, status, JOB_STATUS)
    if status["state"] not in STATES:
        raise ProtocolError("%s: unknown state %r" % (what, status["state"][:40]))
    return status

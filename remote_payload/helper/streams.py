"""Server side of logs and fetch: byte streams with framing.

``follow`` frames: 1 type byte + 4-byte big-endian length + payload. ``D`` data, ``H``
heartbeat (sent when the log is quiet, so the laptop can tell a quiet job from a stalled
connection), ``E`` end (the log drained; when following, the job is terminal). ``E`` carries the
node's terminal status as JSON (what the ``status`` request reports for it), so the laptop needs
no further round trip; it is empty when the status is not terminal (running, lost, unknown) or
too large.

``send`` frames: a JSON header line {path, offset, size}, then ``size`` raw bytes; a final
``{"end": true}`` line. ``size`` is at most the requested size less the offset, so a file
that grows while a running job is fetched is sent as the manifest listed it; it is less
only when the file shrank.
"""

from __future__ import annotations

import json
import os
import struct
import time
from typing import IO, Any, Callable, Dict, List, Optional, Tuple

from remote_payload.contract.protocol import TERMINAL
from remote_payload.jobdir.status import last_metrics, read_status

POLL_S = 0.05  # how often a followed log is read, and status.json looked at (one stat)
FINISHED_EVERY_S = 1.0  # ``finished()`` is asked at least this often, and whenever status.json changed
MAX_FINAL = 512 << 10  # the largest status an E frame carries (the laptop takes frames up to 1 MiB)


class StreamError(Exception):
    pass


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + struct.pack(">I", len(payload)) + payload


def _stat_key(path: str) -> Optional[Tuple[int, int, int]]:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def follow(path: str, offset: int, out: IO[bytes], finished: Callable[[], bool], follow: bool,
           heartbeat_s: float) -> None:
    """Stream ``path`` (``<job_dir>/logs/nodeN.log``) from ``offset``; with ``follow``, until
    ``finished()`` and drained.

    The end is noticed within ``POLL_S`` of the terminal state being written: ``finished()``
    (a full status probe) is asked whenever the job's ``status.json`` changed (it is replaced
    atomically, so its inode changes with every write) and at least every
    ``FINISHED_EVERY_S`` (a vanished supervisor changes no file). The log is drained after
    ``finished()`` said yes, so every line written before the terminal state is sent."""
    status_path = os.path.join(os.path.dirname(os.path.dirname(path)), "status.json")
    quiet_since = time.time()
    seen: Optional[Tuple[int, int, int]] = None
    asked = 0.0
    ended = b"" if follow else final_status(path)  # read before the log: a terminal job's log is whole
    while True:
        done = not follow
        if follow:
            key, now = _stat_key(status_path), time.time()
            if key != seen or now - asked >= FINISHED_EVERY_S:
                seen, asked = key, now
                done = finished()
        sent = False
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                while True:
                    chunk = f.read(1 << 16)
                    if not chunk:
                        break
                    out.write(frame(b"D", chunk))
                    offset += len(chunk)
                    sent = True
        except FileNotFoundError:
            pass
        if done:
            out.write(frame(b"E", final_status(path) if follow else ended))
            out.flush()
            return
        now = time.time()
        if sent:
            quiet_since = now
        elif now - quiet_since >= heartbeat_s:
            out.write(frame(b"H"))
            quiet_since = now
        out.flush()
        time.sleep(POLL_S)


def final_status(path: str) -> bytes:
    """The terminal status of the job whose log is ``path``, as ``agent status`` reports it
    (status.json read typed and bounded by ``jobdir/status.py``'s ``read_status``, with the newest metrics
    row); b'' when it is not terminal (the laptop then asks) or its JSON is over ``MAX_FINAL``."""
    job_dir = os.path.dirname(os.path.dirname(path))
    try:
        st = read_status(os.path.join(job_dir, "status.json"))
        if not isinstance(st, dict) or st.get("state") not in TERMINAL:
            return b""
        st["job_id"] = os.path.basename(job_dir)
        metrics = last_metrics(os.path.join(job_dir, "metrics.jsonl"))
        if metrics is not None:
            st["metrics"] = metrics
        data = json.dumps(st).encode("utf-8")
    except Exception:  # noqa: BLE001 - the laptop asks for the status itself
        return b""
    return data if len(data) <= MAX_FINAL else b""


def tail_offset(path: str, lines: int) -> int:
    """The byte offset where the last ``lines`` lines of ``path`` begin."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return 0
    with open(path, "rb") as f:
        start = max(0, size - max(lines, 1) * 512)
        f.seek(start)
        data = f.read()
    cut = len(data)
    for _ in range(lines + (1 if data.endswith(b"\n") else 0)):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            return start
    return start + cut + 1


def send(job_dir: str, requests: List[Dict[str, Any]], out: IO[bytes]) -> None:
    """Stream the requested files of ``job_dir`` from their offsets; never a symlink or a
    path that leaves the folder."""
    base = os.path.realpath(job_dir)
    for req in requests:
        rel = req["path"]
        if not isinstance(rel, str) or os.path.isabs(rel) or ".." in rel.split("/"):
            raise StreamError("refusing to send %r" % (rel,))
        full = os.path.join(base, rel)
        if os.path.islink(full) or not os.path.realpath(full).startswith(base + os.sep):
            raise StreamError("refusing to send %r" % rel)
        offset = int(req["offset"])
        with open(full, "rb") as f:
            size = max(os.fstat(f.fileno()).st_size - offset, 0)
            if "size" in req:  # the manifest's size: a growing file is sent as it was listed
                size = min(size, max(int(req["size"]) - offset, 0))
            f.seek(offset)
            out.write((json.dumps({"path": rel, "offset": offset, "size": size}) + "\n").encode())
            remaining = size
            while remaining:
                chunk = f.read(min(remaining, 1 << 20))
                if not chunk:
                    raise StreamError("%s shrank while being sent" % rel)
                out.write(chunk)
                remaining -= len(chunk)
    out.write(b'{"end": true}\n')
    out.flush()

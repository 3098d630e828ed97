"""Server side of logs and fetch: byte streams with framing.

``follow`` frames: 1 type byte + 4-byte big-endian length + payload. ``D`` data, ``H``
heartbeat (sent when the log is quiet, so the laptop can tell a quiet job from a stalled
connection), ``E`` end (the job is terminal and the log drained).

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
from typing import IO, Any, Callable, Dict, List

POLL_S = 0.2


class StreamError(Exception):
    pass


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + struct.pack(">I", len(payload)) + payload


def follow(path: str, offset: int, out: IO[bytes], finished: Callable[[], bool], follow: bool,
           heartbeat_s: float) -> None:
    """Stream ``path`` from ``offset``; with ``follow``, until ``finished()`` and drained."""
    quiet_since = time.time()
    while True:
        done = not follow or finished()
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
            out.write(frame(b"E"))
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

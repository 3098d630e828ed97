"""A move's files copied server to server: the target pulls them from the source over SSH.

Standard library only, Python >= 3.8. Used only after the user agreed (``orch resume --on
--direct``, or yes at the prompt): the laptop asks the target for a fresh key (``make_key``),
adds its public half to the source's authorized_keys for the copy, and removes it after.

``pull`` runs the OpenSSH client with that key only (``IdentitiesOnly``, ``BatchMode``), the
source's host key as pinned on the laptop as the only known host (``StrictHostKeyChecking``),
and the source's helper command as the laptop built it (quoted in orch's one place); it asks
that helper for ``send`` (protocol frames) and writes the stream into the staging folder
through ``move/job.py``'s ``receive`` — the same verified, resumable write as a copy through the laptop.
The key files are deleted when ``pull`` ends, whatever happened.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from typing import Any, Dict, List, Optional

from remote_payload.contract import protocol
from remote_payload.contract.bytequeue import ByteQueue
from remote_payload.move import job as movejob

KEYS = ".orch-move-keys"
CONNECT_S = 20


def make_key(root: str, job_id: str) -> Dict[str, Any]:
    """A new ed25519 key pair for one move: ``{"public": line, "key": path of the private half}``."""
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        raise movejob.MoveError("this host has no OpenSSH client (ssh, ssh-keygen): copy through the laptop instead")
    base = os.path.join(root, KEYS)
    os.makedirs(base, mode=0o700, exist_ok=True)
    folder = tempfile.mkdtemp(prefix=job_id[:40] + "-", dir=base)
    key = os.path.join(folder, "id_ed25519")
    proc = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "orch-move " + job_id[:80], "-f", key],
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    if proc.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise movejob.MoveError("ssh-keygen failed: %s" % proc.stderr.decode("utf-8", "replace").strip()[-300:])
    with open(key + ".pub", encoding="utf-8") as f:
        return {"public": f.read().strip(), "key": key}


class Frames:
    """The source helper's ``send`` reply read like a file: its D frames' bytes, then b"" at
    the R frame (kept in ``reply``)."""

    def __init__(self, stream: Any) -> None:
        self.stream, self.buf, self.reply = stream, ByteQueue(), None  # type: Any

    def read(self, n: int = -1) -> bytes:
        while self.reply is None and (n < 0 or len(self.buf) < n):
            got = protocol.read_frame(self.stream)
            if got is None:
                raise movejob.MoveError("the source's helper ended mid-stream")
            kind, payload = got
            if kind == protocol.DATA:
                self.buf.put(payload)
            elif kind == protocol.REPLY:
                self.reply = json.loads(payload.decode("utf-8"))
            else:
                raise movejob.MoveError("the source's helper sent a %r frame" % kind)
        return self.buf.take(n)


def pull(root: str, job_id: str, key: str, address: str, port: int, user: str, host_key: str, command: str,
         expected: List[Dict[str, Any]], requests: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Copy ``requests`` ({path, offset, size}) of the source's job into the staging folder
    (see the module contract); ``{"written", "bytes"}``."""
    folder = os.path.dirname(os.path.realpath(key))
    if os.path.dirname(folder) != os.path.realpath(os.path.join(root, KEYS)):
        raise movejob.MoveError("refusing a key outside %s" % os.path.join(root, KEYS))
    try:
        known = os.path.join(folder, "known_hosts")
        with open(known, "w", encoding="utf-8") as f:
            f.write("%s %s\n" % (address if port == 22 else "[%s]:%d" % (address, port), host_key))
        argv = ["ssh", "-p", str(port), "-i", key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=" + known, "-o", "GlobalKnownHostsFile=/dev/null",
                "-o", "ConnectTimeout=%d" % CONNECT_S, "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4",
                "-l", user, address, "--", command]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        errors: List[bytes] = []
        drain = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
        drain.start()
        try:
            return _session(proc, root, job_id, expected, requests)
        except (movejob.MoveError, protocol.ProtocolError, OSError, ValueError) as exc:
            proc.kill()
            drain.join(timeout=5)
            said = b"".join(errors).decode("utf-8", "replace").strip().splitlines()
            raise movejob.MoveError("copying from the source directly failed: %s%s"
                                    % (exc, ("; ssh said: " + said[-1][:300]) if said else ""))
        finally:
            proc.wait()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _session(proc: "subprocess.Popen[bytes]", root: str, job_id: str, expected: List[Dict[str, Any]],
             requests: List[Dict[str, Any]]) -> Dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    seen = b""
    while not seen.endswith(protocol.MAGIC):  # a login profile may print anything first
        byte = proc.stdout.read(1)
        if not byte or len(seen) > (1 << 16):
            raise movejob.MoveError("the source's helper did not start")
        seen += byte
    request = {"op": "send", "args": {"job": job_id, "files": requests}}
    proc.stdin.write(protocol.frame(protocol.REQUEST, json.dumps(request).encode("utf-8")))
    proc.stdin.flush()
    frames = Frames(proc.stdout)
    try:
        result = movejob.receive(root, job_id, expected, frames)
    except movejob.MoveError:
        if isinstance(frames.reply, dict) and "error" in frames.reply:  # the source said why its stream ended
            raise movejob.MoveError("the source refused: %s" % str(frames.reply["error"])[:500])
        raise
    frames.read(1)  # up to the reply
    reply: Optional[Dict[str, Any]] = frames.reply
    if not isinstance(reply, dict) or "error" in reply:
        raise movejob.MoveError("the source refused: %s" % ((reply or {}).get("error") if isinstance(reply, dict) else reply))
    proc.stdin.close()
    return result

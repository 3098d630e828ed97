"""Server-side helper: each orch step is one call of this module, one SSH round trip.

Run as ``python -c BOOT ROOT HASH COMMAND ...`` (see ``orchestrator/payload.py``), with the
host's python through a login shell. Standard library only, Python >= 3.8. Commands print
one JSON object on stdout (``follow`` and ``send`` stream bytes); a user-facing failure
prints ``{"error": ...}`` and exits 4.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
from typing import Any, Dict, List, Optional

from remote_payload.common import TERMINAL, atomic_write_json, boot_id, build_manifest, group_alive, pid_alive, read_json

PENDING_GRACE_S = 30.0


class AgentError(Exception):
    pass


class Agent:
    def __init__(self, root: str, payload_dir: str) -> None:
        self.root, self.payload_dir = root, payload_dir

    def job_dir(self, job_id: str) -> str:
        if not job_id or "/" in job_id or job_id.startswith("."):
            raise AgentError("bad job id %r" % job_id)
        return os.path.join(self.root, "jobs", job_id)

    def workspace(self, project: str) -> str:
        if not project or "/" in project or project.startswith("."):
            raise AgentError("bad project name %r" % project)
        return os.path.join(self.root, "workspace", project)

    def sync_state_path(self, project: str) -> str:
        return os.path.join(self.root, "state", "sync-%s.json" % project)

    # -- facts and sync -------------------------------------------------------------
    def hello(self, project: Optional[str] = None, gpus: bool = False) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "python": sys.executable, "python_version": "%d.%d.%d" % sys.version_info[:3],
            "root": self.root, "boot_id": boot_id(), "hostname": socket.gethostname(),
        }
        if gpus:
            out["gpus"] = count_gpus()
        if project:
            state = read_json(self.sync_state_path(project)) or {"files": {}}
            ws = self.workspace(project)
            edited, missing = [], []
            for rel, entry in state["files"].items():
                try:
                    st = os.lstat(os.path.join(ws, rel))
                except OSError:
                    missing.append(rel)
                    continue
                if st.st_size != entry.get("rsize") or st.st_mtime_ns != entry.get("rmtime_ns"):
                    edited.append(rel)
            out["sync"] = {"files": state["files"], "edited": sorted(edited), "missing": sorted(missing)}
        return out

    def receive(self, project: str) -> Dict[str, Any]:
        """Read a tar stream: ``.orch-sync.json`` first, then changed files. Each file lands
        under a temporary name and is renamed into place; then deletions; then the state."""
        ws = self.workspace(project)
        os.makedirs(ws, exist_ok=True)
        old = (read_json(self.sync_state_path(project)) or {"files": {}})["files"]
        control: Optional[Dict[str, Any]] = None
        written = nbytes = 0
        with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as tar:
            for member in tar:
                if control is None:
                    if member.name != ".orch-sync.json":
                        raise AgentError("sync stream must start with .orch-sync.json")
                    control = json.loads(tar.extractfile(member).read().decode("utf-8"))
                    continue
                dest = safe_join(ws, member.name)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                tmp = os.path.join(os.path.dirname(dest), ".orch-tmp-" + os.path.basename(dest))
                if member.issym():
                    if os.path.lexists(tmp):
                        os.unlink(tmp)
                    os.symlink(member.linkname, tmp)
                elif member.isfile():
                    src = tar.extractfile(member)
                    with open(tmp, "wb") as f:
                        shutil.copyfileobj(src, f, 1 << 20)
                    os.chmod(tmp, member.mode & 0o7777)
                    nbytes += member.size
                else:
                    continue
                if os.path.isdir(dest) and not os.path.islink(dest):
                    shutil.rmtree(dest)
                os.replace(tmp, dest)
                written += 1
        if control is None:
            raise AgentError("empty sync stream")
        deleted = 0
        for rel in control["delete"]:
            if rel in old and rel not in control["entries"]:
                try:
                    os.unlink(safe_join(ws, rel))
                    deleted += 1
                except FileNotFoundError:
                    pass
        files = {}
        for rel, entry in control["entries"].items():
            st = os.lstat(safe_join(ws, rel))
            files[rel] = dict(entry, rsize=st.st_size, rmtime_ns=st.st_mtime_ns)
        os.makedirs(os.path.dirname(self.sync_state_path(project)), exist_ok=True)
        atomic_write_json(self.sync_state_path(project), {"files": files})
        return {"written": written, "deleted": deleted, "bytes": nbytes, "workspace": ws}

    # -- jobs ------------------------------------------------------------------------
    def launch(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """Snapshot the workspace into ``jobs/<id>/code`` (hard links), write job.json, and
        start the supervisor. Idempotent: a job id that exists is reported, not restarted."""
        job = request["job"]
        final = self.job_dir(job["job_id"])
        if os.path.exists(final):
            return {"existing": True, "status": self.probe(job["job_id"])}
        jobs = os.path.dirname(final)
        os.makedirs(jobs, exist_ok=True)
        tmp = os.path.join(jobs, ".tmp-%s-%d" % (job["job_id"], os.getpid()))
        ws = self.workspace(request["project"])
        state = read_json(self.sync_state_path(request["project"])) or {"files": {}}
        code = os.path.join(tmp, "code")
        os.makedirs(code)
        for rel in state["files"]:
            src, dst = safe_join(ws, rel), safe_join(code, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
            else:
                os.link(src, dst)
        os.makedirs(os.path.join(tmp, "logs"))
        atomic_write_json(os.path.join(tmp, "job.json"), job)
        if request.get("train") is not None:
            atomic_write_json(os.path.join(tmp, "train.json"), request["train"])
        try:
            os.rename(tmp, final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            return {"existing": True, "status": self.probe(job["job_id"])}
        return {"existing": False, "job_dir": final, "pid": self.spawn(final, request.get("node_rank", 0))}

    def spawn(self, job_dir: str, node_rank: int) -> int:
        log = open(os.path.join(job_dir, "logs", "supervisor.log"), "ab")
        proc = subprocess.Popen(
            [sys.executable, os.path.join(self.payload_dir, "remote_payload", "supervisor.py"),
             "--job-dir", job_dir, "--node-rank", str(node_rank)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, close_fds=True,
        )
        return proc.pid

    def probe(self, job_id: str) -> Dict[str, Any]:
        """The job's status with ``lost`` decided here: no live supervisor, no terminal state."""
        d = self.job_dir(job_id)
        if not os.path.isdir(d):
            return {"job_id": job_id, "state": "unknown", "reason": "no such job on this host"}
        st = read_json(os.path.join(d, "status.json"))
        if not isinstance(st, dict) or "state" not in st:
            age = time.time() - os.stat(d).st_mtime
            if age < PENDING_GRACE_S:
                return {"job_id": job_id, "state": "pending"}
            return {"job_id": job_id, "state": "lost", "reason": "the supervisor never started"}
        st["job_id"] = job_id
        if st["state"] not in TERMINAL:
            if st.get("boot_id") != boot_id():
                st.update(state="lost", reason="the server restarted since the job started")
            elif not pid_alive(int(st.get("supervisor_pid") or 0), "supervisor"):
                st.update(state="lost", reason="the supervisor is not running (killed?)")
        metrics = last_line(os.path.join(d, "metrics.jsonl"))
        if metrics is not None:
            st["metrics"] = metrics
        return st

    def status(self, job_ids: List[str]) -> Dict[str, Any]:
        return {"jobs": {j: self.probe(j) for j in job_ids}}

    def cancel(self, job_id: str, grace: float) -> Dict[str, Any]:
        st = self.probe(job_id)
        if st["state"] in TERMINAL or st["state"] == "unknown":
            return st
        d = self.job_dir(job_id)
        if st["state"] != "lost":
            os.kill(int(st["supervisor_pid"]), signal.SIGTERM)
            deadline = time.time() + grace + 15
            while time.time() < deadline:
                st = self.probe(job_id)
                if st["state"] in TERMINAL or st["state"] == "lost":
                    break
                time.sleep(0.1)
        if st["state"] not in TERMINAL:  # no supervisor left to do it: do it here
            pgid = int(st.get("pgid") or 0)
            if pgid > 0:
                kill_group(pgid, grace)
            status = read_json(os.path.join(d, "status.json")) or {"job_id": job_id}
            status.update(state="cancelled", reason="cancelled (supervisor was gone)", ended=time.time())
            manifest_path = os.path.join(d, "manifest.json")
            atomic_write_json(manifest_path, build_manifest(d, read_json(manifest_path)))
            atomic_write_json(os.path.join(d, "status.json"), status)
            st = self.probe(job_id)
        return st

    def resume(self, job_id: str) -> Dict[str, Any]:
        st = self.probe(job_id)
        if st["state"] not in ("failed", "lost", "cancelled"):
            raise AgentError("job %s is %s; only a failed, lost or cancelled job can be resumed" % (job_id, st["state"]))
        d = self.job_dir(job_id)
        old = read_json(os.path.join(d, "status.json")) or {}
        old.update(state="pending", reason="resuming", supervisor_pid=None)
        atomic_write_json(os.path.join(d, "status.json"), old)
        return {"pid": self.spawn(d, int(old.get("node_rank") or 0))}

    # -- logs and files --------------------------------------------------------------
    def follow(self, job_id: str, offset: int, node: int, follow: bool) -> int:
        path = os.path.join(self.job_dir(job_id), "logs", "node%d.log" % node)
        out = sys.stdout.buffer
        while True:
            done = not follow or self.probe(job_id)["state"] in TERMINAL + ("lost", "unknown")
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    while True:
                        chunk = f.read(1 << 16)
                        if not chunk:
                            break
                        out.write(chunk)
                        offset += len(chunk)
                    out.flush()
            except FileNotFoundError:
                pass
            if done:
                return 0
            time.sleep(0.2)

    def tail_offset(self, job_id: str, node: int, lines: int) -> Dict[str, Any]:
        """The byte offset where the last ``lines`` lines of the node log begin."""
        path = os.path.join(self.job_dir(job_id), "logs", "node%d.log" % node)
        try:
            size = os.path.getsize(path)
        except OSError:
            return {"offset": 0}
        with open(path, "rb") as f:
            start = max(0, size - max(lines, 1) * 512)
            f.seek(start)
            data = f.read()
        cut = len(data)
        for _ in range(lines + (1 if data.endswith(b"\n") else 0)):
            cut = data.rfind(b"\n", 0, cut)
            if cut < 0:
                return {"offset": start}
        return {"offset": start + cut + 1}

    def manifest(self, job_id: str) -> Dict[str, Any]:
        d = self.job_dir(job_id)
        path = os.path.join(d, "manifest.json")
        st = self.probe(job_id)
        current = read_json(path)
        if not (st["state"] in TERMINAL and isinstance(current, dict)):
            current = build_manifest(d, current)
        current["outputs"] = (read_json(os.path.join(d, "job.json")) or {}).get("outputs")
        return current

    def send(self, job_id: str) -> int:
        """Stdin: JSON list of {path, offset}. Stdout: for each, a JSON header line
        {path, offset, size} and ``size`` raw bytes; then {"end": true}."""
        d = os.path.realpath(self.job_dir(job_id))
        out = sys.stdout.buffer
        for req in json.loads(sys.stdin.read()):
            full = safe_join(d, req["path"])
            if os.path.islink(full) or not os.path.realpath(full).startswith(d + os.sep):
                raise AgentError("refusing to send %r" % req["path"])
            with open(full, "rb") as f:
                size = os.fstat(f.fileno()).st_size - int(req["offset"])
                f.seek(int(req["offset"]))
                out.write((json.dumps({"path": req["path"], "offset": req["offset"], "size": max(size, 0)}) + "\n").encode())
                remaining = max(size, 0)
                while remaining:
                    chunk = f.read(min(remaining, 1 << 20))
                    if not chunk:
                        raise AgentError("%s shrank while being sent" % req["path"])
                    out.write(chunk)
                    remaining -= len(chunk)
        out.write(b'{"end": true}\n')
        out.flush()
        return 0


def safe_join(base: str, rel: str) -> str:
    if not rel or os.path.isabs(rel) or ".." in rel.split("/") or "\x00" in rel:
        raise AgentError("unsafe path %r" % rel)
    return os.path.join(base, rel)


def count_gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    n = sum(1 for line in out.decode("utf-8", "replace").splitlines() if line.startswith("GPU "))
    if visible is not None:
        n = min(n, len([v for v in visible.split(",") if v.strip()]))
    return n


def kill_group(pgid: int, grace: float) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + grace
    while time.time() < deadline:
        if not group_alive(pgid):
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.time() + 5
    while group_alive(pgid) and time.time() < deadline:
        time.sleep(0.05)


def last_line(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def main(root: str, payload_dir: str, argv: List[str]) -> int:
    agent = Agent(root, payload_dir)
    cmd, args = argv[0], argv[1:]
    try:
        lock = None
        if cmd in ("launch", "resume", "cancel"):
            os.makedirs(root, exist_ok=True)
            lock = open(os.path.join(root, ".lock"), "a")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if cmd == "hello":
            result: Any = agent.hello(args[0] if args and args[0] != "-" else None, "--gpus" in args)
        elif cmd == "receive":
            result = agent.receive(args[0])
        elif cmd == "launch":
            result = agent.launch(json.loads(sys.stdin.read()))
        elif cmd == "status":
            result = agent.status(args)
        elif cmd == "cancel":
            result = agent.cancel(args[0], float(args[1]))
        elif cmd == "resume":
            result = agent.resume(args[0])
        elif cmd == "follow":
            return agent.follow(args[0], int(args[1]), int(args[2]), args[3] == "1")
        elif cmd == "tail-offset":
            result = agent.tail_offset(args[0], int(args[1]), int(args[2]))
        elif cmd == "manifest":
            result = agent.manifest(args[0])
        elif cmd == "send":
            return agent.send(args[0])
        else:
            raise AgentError("unknown agent command %r" % cmd)
    except (AgentError, OSError, ValueError, KeyError) as exc:
        sys.stdout.write(json.dumps({"error": "%s: %s" % (type(exc).__name__, exc) if not isinstance(exc, AgentError) else str(exc)}) + "\n")
        return 4
    sys.stdout.write(json.dumps(result) + "\n")
    return 0

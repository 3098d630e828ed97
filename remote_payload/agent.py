"""Server-side helper: each orch step is one call of this module, one SSH round trip.

Run as ``python -c BOOT ROOT HASH COMMAND ...`` (see ``orchestrator/payload.py``), with the
host's python through a login shell. Standard library only, Python >= 3.8. Commands print
one JSON object on stdout (``follow`` and ``send`` stream bytes); a user-facing failure
prints ``{"error": ...}`` and exits 4.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from remote_payload import lease, netcheck, onfinish, proctree, repro, streams, workspace
from remote_payload.common import (CODE_DIR, SNAPSHOT, TERMINAL, atomic_write_json, boot_id, build_manifest, pid_alive,
                                   read_json, snapshot_record)
from remote_payload.jobstate import kill_group, last_metrics, read_status, survivors_of

PENDING_GRACE_S = 30.0
LOCK_WAIT_S = 300.0  # cancel holds the jobs lock for its grace period (at most a few minutes)


class AgentError(Exception):
    pass


class Agent:
    def __init__(self, root: str, payload_dir: str) -> None:
        self.root, self.payload_dir = root, payload_dir

    def job_dir(self, job_id: str) -> str:
        if not job_id or "/" in job_id or job_id.startswith("."):
            raise AgentError("bad job id %r" % job_id)
        return os.path.join(self.root, "jobs", job_id)

    # -- facts and sync -------------------------------------------------------------
    def hello(self, project: Optional[str] = None, gpus: bool = False) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "python": sys.executable, "python_version": "%d.%d.%d" % sys.version_info[:3],
            "root": self.root, "boot_id": boot_id(), "hostname": socket.gethostname(),
        }
        if gpus:
            out["gpus"] = count_gpus()
        if project:
            out["sync"] = workspace.sync_state(self.root, project)
        return out

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
        os.makedirs(tmp)
        code = os.path.join(tmp, CODE_DIR)
        if request.get("from_job"):  # orch rerun: the earlier job's code and records, not the workspace
            earlier = self.job_dir(request["from_job"])
            shipped = (read_json(os.path.join(earlier, SNAPSHOT)) or {}).get("files")  # not what that job wrote
            linked = workspace.link_tree(os.path.join(earlier, CODE_DIR), code,
                                         only=set(shipped) if isinstance(shipped, dict) else None)
            workspace.link_tree(os.path.join(earlier, "repro"), os.path.join(tmp, "repro"), only=repro.FROM_LAPTOP)
        else:
            linked = workspace.snapshot(self.root, request["project"], code)
        os.makedirs(code, exist_ok=True)
        atomic_write_json(os.path.join(tmp, SNAPSHOT), snapshot_record(code, linked))
        repro.write_submission(os.path.join(tmp, "repro"), request.get("repro") or {})
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
        log = open(os.path.join(job_dir, "logs", "supervisor-node%d.log" % node_rank), "ab")
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
        st = read_status(os.path.join(d, "status.json"))
        if not isinstance(st, dict) or "state" not in st:
            age = time.time() - os.stat(d).st_mtime
            if age < PENDING_GRACE_S:
                return {"job_id": job_id, "state": "pending"}
            return {"job_id": job_id, "state": "lost", "reason": "the supervisor never started"}
        st["job_id"] = job_id
        if st["state"] == "unknown":  # broken status.json: say so, decide nothing from it
            return st
        if st["state"] == "pending" and time.time() - float(st.get("heartbeat") or 0) < PENDING_GRACE_S:
            pass  # resumed: the new supervisor is starting
        elif st["state"] not in TERMINAL:
            if st.get("boot_id") != boot_id():
                st.update(state="lost", reason="the server restarted since the job started")
            elif not pid_alive(int(st.get("supervisor_pid") or 0), "supervisor"):
                survivors = survivors_of(st)
                if survivors:  # never "lost" while the job's processes run: one live attempt at a time
                    st.update(state="running", unsupervised=True, survivors=len(survivors),
                              reason="the supervisor is gone (killed?) but %d of the job's processes still run: "
                                     "orch cancel stops them; orch resume stops them, then restarts from the "
                                     "last checkpoint" % len(survivors))
                else:
                    st.update(state="lost", reason="the supervisor is not running (killed?)")
        metrics = last_metrics(os.path.join(d, "metrics.jsonl"))
        if metrics is not None:
            st["metrics"] = metrics
        return st

    def status(self, job_ids: List[str]) -> Dict[str, Any]:
        """Each job probed on its own: one job's broken files make that job ``unknown``
        (with the reason), never the host's whole answer fail."""
        out: Dict[str, Any] = {}
        for job_id in job_ids:
            try:
                out[job_id] = self.probe(job_id)
            except Exception as exc:  # noqa: BLE001 - a job's own files are untrusted input
                out[job_id] = {"job_id": job_id, "state": "unknown",
                               "reason": ("its files on the server are unreadable: %s: %s" % (type(exc).__name__, exc))[:300]}
        return {"jobs": out}

    def cancel(self, job_id: str, grace: float) -> Dict[str, Any]:
        st = self.probe(job_id)
        if st["state"] in TERMINAL or st["state"] == "unknown":
            return st
        d = self.job_dir(job_id)
        if st["state"] != "lost" and not st.get("unsupervised"):
            try:
                os.kill(int(st["supervisor_pid"]), signal.SIGTERM)
            except (ProcessLookupError, TypeError, ValueError):
                pass  # it just ended, or never recorded its pid: the wait below sees what state it left
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
            proctree.stop([(int(p[0]), int(p[1])) for p in st.get("procs") or []], grace)
            status = read_json(os.path.join(d, "status.json")) or {"job_id": job_id}
            status.update(state="cancelled", reason="cancelled (supervisor was gone)", ended=time.time())
            manifest_path = os.path.join(d, "manifest.json")
            atomic_write_json(manifest_path, build_manifest(d, read_json(manifest_path)))
            atomic_write_json(os.path.join(d, "status.json"), status)
            st = self.probe(job_id)
        return st

    def resume(self, job_id: str, whole_job: bool = False) -> Dict[str, Any]:
        """Respawn the supervisor. ``whole_job``: this node restarts with the others of a
        multi-node job, so a node that had succeeded restarts too."""
        st = self.probe(job_id)
        if st.get("unsupervised"):  # the attempt whose supervisor died still runs: stop it (it checkpoints), wait
            d = self.job_dir(job_id)
            grace = float((read_json(os.path.join(d, "job.json")) or {}).get("grace_s") or 30)
            proctree.stop(survivors_of(st), grace)
            if survivors_of(st):
                raise AgentError("job %s: processes of the earlier attempt do not stop; not resumed" % job_id)
            st = self.probe(job_id)
        if st["state"] not in ("failed", "lost", "cancelled") + (("succeeded",) if whole_job else ()):
            raise AgentError("job %s is %s; only a failed, lost or cancelled job can be resumed" % (job_id, st["state"]))
        d = self.job_dir(job_id)
        old = read_json(os.path.join(d, "status.json")) or {}
        old.update(state="pending", reason="resuming", supervisor_pid=None, heartbeat=time.time())
        atomic_write_json(os.path.join(d, "status.json"), old)
        return {"pid": self.spawn(d, int(old.get("node_rank") or 0))}

    # -- logs and files --------------------------------------------------------------
    def log_path(self, job_id: str, node: int) -> str:
        return os.path.join(self.job_dir(job_id), "logs", "node%d.log" % node)

    def manifest(self, job_id: str) -> Dict[str, Any]:
        d = self.job_dir(job_id)
        path = os.path.join(d, "manifest.json")
        st = self.probe(job_id)
        current = read_json(path)
        if not (st["state"] in TERMINAL and isinstance(current, dict)):
            current = build_manifest(d, current)
        current["outputs"] = (read_json(os.path.join(d, "job.json")) or {}).get("outputs")
        current["state"] = st["state"]
        return current


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


def fail(message: str) -> int:
    """A user-facing failure: one JSON line on stdout (after any partial stream), exit 4."""
    sys.stdout.write("\n" + json.dumps({"error": message}) + "\n")
    sys.stdout.flush()
    return 4


def main(root: str, payload_dir: str, argv: List[str]) -> int:
    agent = Agent(root, payload_dir)
    cmd, args = argv[0], argv[1:]
    try:
        held = None  # noqa: F841 - the jobs lease lives as long as this call
        request = sys.stdin.read() if cmd == "launch" else ""  # all of it before locking: a frozen link stalls no one
        if cmd in ("launch", "resume", "cancel"):  # bounded work under the lock; a stuck holder is stopped
            os.makedirs(root, exist_ok=True)
            held = lease.acquire(os.path.join(root, ".lock"), cmd + " jobs", stall_s=LOCK_WAIT_S, max_wait_s=LOCK_WAIT_S)
        if cmd == "hello":
            result: Any = agent.hello(args[0] if args and args[0] != "-" else None, "--gpus" in args)
        elif cmd == "receive":
            result = workspace.receive(root, args[0], sys.stdin.buffer, float(args[1]) if len(args) > 1 else lease.STALL_S)
        elif cmd == "launch":
            result = agent.launch(json.loads(request))
        elif cmd == "status":
            result = agent.status(args)
        elif cmd == "cancel":
            result = agent.cancel(args[0], float(args[1]))
        elif cmd == "resume":
            result = agent.resume(args[0], "--whole-job" in args)
        elif cmd == "follow":
            job_id, offset, node, follow, heartbeat = args[0], int(args[1]), int(args[2]), args[3] == "1", float(args[4])
            finished = lambda: agent.probe(job_id)["state"] in TERMINAL + ("lost", "unknown")  # noqa: E731
            streams.follow(agent.log_path(job_id, node), offset, sys.stdout.buffer, finished, follow, heartbeat)
            return 0
        elif cmd == "tail-offset":
            result = {"offset": streams.tail_offset(agent.log_path(args[0], int(args[1])), int(args[2]))}
        elif cmd == "manifest":
            result = agent.manifest(args[0])
        elif cmd == "send-ws":  # files of a project's workspace (orch submit --pull-remote-edits)
            ws = os.path.join(root, "workspace", args[0])
            streams.send(ws, json.loads(sys.stdin.read()), sys.stdout.buffer)
            return 0
        elif cmd == "send":
            streams.send(agent.job_dir(args[0]), json.loads(sys.stdin.read()), sys.stdout.buffer)
            return 0
        elif cmd == "show":
            result = dict(repro.show(agent.job_dir(args[0])), status=agent.probe(args[0]))
        elif cmd == "fetched":
            open(os.path.join(agent.job_dir(args[0]), onfinish.FETCHED), "a").close()
            result = {"ok": True}
        elif cmd == "free-port":
            result = netcheck.free_port()
        elif cmd == "listen":
            return netcheck.listen(int(args[0]), float(args[1]))
        elif cmd == "tcp-check":
            result = netcheck.tcp_check(args[0], int(args[1]))
        elif cmd == "preflight":
            from remote_payload import preflight  # standard library only, like this module

            result = preflight.collect(root, args)
        else:
            raise AgentError("unknown agent command %r" % cmd)
    except (AgentError, workspace.SyncError, streams.StreamError, lease.LeaseBusy) as exc:
        return fail(str(exc))
    except (OSError, ValueError, KeyError) as exc:
        return fail("%s: %s" % (type(exc).__name__, exc))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0

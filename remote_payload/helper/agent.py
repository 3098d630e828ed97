"""Server-side jobs and facts: what the requests of ``serve.py`` do with a host's root.

Standard library only, Python >= 3.8. ``AgentError`` is a failure the user should read (it
becomes the request's ``{"error": ...}`` reply).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from remote_payload.contract.jobfolder import AWAITING_FETCH, CODE_DIR, SNAPSHOT, SUPERVISOR_SCRIPT, atomic_write_json, read_json
from remote_payload.contract.protocol import ACTIVE, GRACE_S, LOST, RESUMABLE, SUCCEEDED, TERMINAL, UNKNOWN
from remote_payload.helper import stage, workspace
from remote_payload.jobdir import answering, processes
from remote_payload.jobdir import record as repro
from remote_payload.jobdir.manifest import build_manifest, keep_hashes, known_hashes, snapshot_record
from remote_payload.jobdir.processes import boot_id, pid_alive
from remote_payload.jobdir.reserve import full_at
from remote_payload.jobdir.status import kill_group, kill_supervisor, last_metrics, read_status, survivors_of
from remote_payload.move import job as movejob
from remote_payload.slurm import job as slurmjob
from remote_payload.supervisor import attempt, secrets

PENDING_GRACE_S = 30.0
UNFINISHED_SHOWN = 50  # jobs orch hosts check lists (unfinished, newest first)
FINISHING_S = 120.0  # how long move_list waits for an ended job's supervisor to finish its records


class AgentError(Exception):
    pass


class Agent:
    def __init__(self, root: str, payload_dir: str) -> None:
        self.root, self.payload_dir = root, payload_dir

    def job_id(self, job_id: str) -> str:
        """``job_id`` if it can name a folder under ``jobs/``; else ``AgentError``."""
        if not job_id or "/" in job_id or job_id.startswith(".") or "\x00" in job_id:
            raise AgentError("bad job id %r" % job_id)
        return job_id

    def job_dir(self, job_id: str) -> str:
        return os.path.join(self.root, "jobs", self.job_id(job_id))

    # -- facts and sync -------------------------------------------------------------
    def hello(self, project: Optional[str] = None, gpus: bool = False, known: Optional[str] = None,
              slurm: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Facts about the host; with ``project``, its sync state (``workspace.sync_state``);
        with ``slurm`` (the env for Slurm's commands), the cluster's (``slurmjob.host_facts``)."""
        out: Dict[str, Any] = {
            "python": sys.executable, "python_version": "%d.%d.%d" % sys.version_info[:3],
            "root": self.root, "boot_id": boot_id(), "hostname": socket.gethostname(), "payload": self.payload_dir,
        }
        if slurm is not None:
            out["slurm"] = slurmjob.host_facts({str(k): str(v) for k, v in slurm.items()}, self.root)
        if gpus:
            out["gpus"] = count_gpus()
        if project:
            out["sync"] = workspace.sync_state(self.root, project, known)
        return out

    # -- jobs ------------------------------------------------------------------------
    def launch(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """Make the code the submit staged (``request["staged"]``, ``stage.take``: exactly the
        tree that submit sent) the job's ``jobs/<id>/code``, write job.json, and start the
        supervisor — on a Slurm login node: write ``slurm.sh`` and sbatch it, the supervisor
        starts in the allocation. Idempotent: a job id that exists is reported, not restarted.
        The values of the job's ``secret_env`` (``request["secrets"]``) go to the supervisor's
        stdin or sbatch's environment, never to a file (``secrets``)."""
        job = request["job"]
        values = self.secret_values(request, job)
        final = self.job_dir(job["job_id"])
        if os.path.exists(final):
            if request.get("staged") and request.get("last", True):  # a rerun of a submit whose launch got here
                stage.discard(self.root, str(request["staged"]))
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
            try:
                linked = stage.take(self.root, str(request.get("staged") or ""), code, bool(request.get("last", True)))
            except stage.StageError as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                raise AgentError(str(exc)) from None
        os.makedirs(code, exist_ok=True)
        atomic_write_json(os.path.join(tmp, SNAPSHOT), snapshot_record(code, linked), compact=True)
        repro.write_submission(os.path.join(tmp, "repro"), request.get("repro") or {})
        os.makedirs(os.path.join(tmp, "logs"))
        atomic_write_json(os.path.join(tmp, "job.json"), job)
        if request.get("train") is not None:
            atomic_write_json(os.path.join(tmp, "train.json"), request["train"])
        if job.get("slurm"):
            with open(os.path.join(tmp, slurmjob.SCRIPT), "w", encoding="utf-8") as f:
                f.write(job["slurm"]["script"])
        try:
            os.rename(tmp, final)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            return {"existing": True, "status": self.probe(job["job_id"])}
        if job.get("slurm"):
            return {"existing": False, "job_dir": final, "slurm_job": self._slurm(slurmjob.submit, final, job, values)}
        return {"existing": False, "job_dir": final, "pid": self.spawn(final, request.get("node_rank", 0), values)}

    def move_list(self, job_id: str) -> Dict[str, Any]:
        """What moving the job carries (``movejob.listing``), with its state here."""
        d = self.job_dir(job_id)
        if not os.path.isdir(d):
            raise AgentError("job %s is not on this host" % job_id)
        deadline = time.time() + FINISHING_S  # an ended job's supervisor still records its environment: let it
        while time.time() < deadline:
            st = read_status(os.path.join(d, "status.json")) or {}
            if st.get("state") not in TERMINAL or not pid_alive(int(st.get("supervisor_pid") or 0), "supervisor") \
                    or os.path.exists(os.path.join(d, AWAITING_FETCH)):  # records done; it waits for this fetch
                break
            time.sleep(0.2)
        return dict(movejob.listing(d), state=self.probe(job_id)["state"])

    def adopt(self, request: Dict[str, Any], files: List[Dict[str, Any]], moved: Dict[str, Any]) -> Dict[str, Any]:
        """A moved job: its staged files become ``jobs/<id>`` (``movejob.adopt``) with
        ``request``'s job.json, then it starts as ``launch`` starts one. Idempotent."""
        job = request["job"]
        values = self.secret_values(request, job)
        final = self.job_dir(job["job_id"])
        if os.path.exists(final):
            return {"existing": True, "status": self.probe(job["job_id"])}
        movejob.adopt(self.root, job["job_id"], final, files, job, request.get("train"), moved)
        if job.get("slurm"):
            return {"existing": False, "job_dir": final, "slurm_job": self._slurm(slurmjob.submit, final, job, values)}
        return {"existing": False, "job_dir": final, "pid": self.spawn(final, request.get("node_rank", 0), values)}

    def _slurm(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except slurmjob.SlurmJobError as exc:
            raise AgentError(str(exc)) from None

    @staticmethod
    def secret_values(request: Dict[str, Any], job: Dict[str, Any]) -> Dict[str, str]:
        """The request's values of job.json's ``secret_env`` (``AgentError`` when one is missing)."""
        try:
            return secrets.checked(request.get("secrets"), job.get("secret_env"))
        except ValueError as exc:
            raise AgentError("job %s: %s" % (job.get("job_id"), exc)) from None

    def spawn(self, job_dir: str, node_rank: int, values: Optional[Dict[str, str]] = None) -> int:
        """Start the node's supervisor, detached; ``values`` (secret_env) go to its stdin."""
        log = open(os.path.join(job_dir, "logs", "supervisor-node%d.log" % node_rank), "ab")
        proc = subprocess.Popen(
            [sys.executable, os.path.join(self.payload_dir, *SUPERVISOR_SCRIPT),
             "--job-dir", job_dir, "--node-rank", str(node_rank), "--secrets-on-stdin"],
            stdin=subprocess.PIPE, stdout=log, stderr=log, start_new_session=True, close_fds=True,
        )
        assert proc.stdin is not None
        secrets.hand_over(proc.stdin, values or {})
        return proc.pid

    def probe(self, job_id: str) -> Dict[str, Any]:
        """The job's status with ``lost`` decided here: no live supervisor, no terminal state
        (a Slurm job's: ``slurmjob.probe``, from Slurm's word). A live supervisor's process
        state and heartbeat age are added, and one silent for several beats is reported not
        answering, the job's state kept (``jobdir/answering.py``)."""
        d = self.job_dir(job_id)
        if not os.path.isdir(d):
            return {"job_id": job_id, "state": "unknown", "reason": "no such job on this host"}
        st = read_status(os.path.join(d, "status.json"))
        job = self.slurm_job(d)
        if job is not None:  # the supervisor runs in an allocation: Slurm says whether it lives
            st = dict(slurmjob.probe(d, job, st), job_id=job_id)
        elif not isinstance(st, dict) or "state" not in st:
            age = time.time() - os.stat(d).st_mtime
            if age < PENDING_GRACE_S:
                return {"job_id": job_id, "state": "pending"}
            return {"job_id": job_id, "state": "lost", "reason": "the supervisor never started"}
        else:
            st["job_id"] = job_id
        for key in answering.FIELDS:  # the probe's own word, never status.json's
            st.pop(key, None)
        if st["state"] == "unknown" or job is not None:  # broken status.json: say so, decide nothing from it
            pass
        elif st["state"] == "pending" and time.time() - float(st.get("heartbeat") or 0) < PENDING_GRACE_S:
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
                elif full_at(d) is not None:  # it could not record the end: never "lost" for a full disk
                    st.update(state="failed", reason="disk full: %s; the supervisor could not record the job's "
                                                     "end" % full_at(d))
                else:
                    st.update(state="lost", reason=answering.gone(int(st.get("supervisor_pid") or 0)))
            else:  # it lives: does it answer (a stopped or hung one keeps the job's state, with the reason)?
                heartbeat_s = (read_json(os.path.join(d, "job.json")) or {}).get("heartbeat_s")
                st.update(answering.look(st, heartbeat_s, time.time()))
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

    def unfinished(self, limit: int = UNFINISHED_SHOWN) -> List[Dict[str, Any]]:
        """The probed statuses of the jobs on this host that are pending, queued, setting up
        or running (of the ``limit`` whose status.json is newest and not terminal): ``orch hosts check`` lists them with their supervisor's
        process state and heartbeat age (``jobdir/answering.py``)."""
        jobs = os.path.join(self.root, "jobs")
        try:
            names = [n for n in os.listdir(jobs) if not n.startswith(".") and os.path.isdir(os.path.join(jobs, n))]
        except OSError:
            return []
        found = []
        for name in names:
            path = os.path.join(jobs, name, "status.json")
            st = read_status(path) or {}
            if st.get("state") not in TERMINAL:
                try:
                    found.append((os.stat(path).st_mtime, name))
                except OSError:
                    found.append((0.0, name))
        ids = [name for _, name in sorted(found, reverse=True)[:limit]]
        probed = [dict(st, job_id=job_id) for job_id, st in self.status(ids)["jobs"].items()]
        return [st for st in probed if st["state"] in ACTIVE]  # a lost job's status.json is never terminal

    def cancel(self, job_id: str, grace: float) -> Dict[str, Any]:
        st = self.probe(job_id)
        if st["state"] in TERMINAL or st["state"] == UNKNOWN:
            return st
        d = self.job_dir(job_id)
        job = self.slurm_job(d)
        if job is not None:
            return dict(self._slurm(slurmjob.cancel, d, job, st, grace), job_id=job_id)
        if st["state"] != "lost" and not st.get("unsupervised"):
            try:
                os.kill(int(st["supervisor_pid"]), signal.SIGTERM)
            except (ProcessLookupError, TypeError, ValueError):
                pass  # it just ended, or never recorded its pid: the wait below sees what state it left
            deadline = time.time() + grace + 15
            while time.time() < deadline:
                st = self.probe(job_id)
                if st["state"] in TERMINAL or st["state"] == LOST:
                    break
                time.sleep(0.1)
        if st["state"] not in TERMINAL:  # no supervisor left to do it, or one that did not: do it here
            why = "cancelled (supervisor was gone)"
            pid = int(st.get("supervisor_pid") or 0)
            if pid_alive(pid, "supervisor"):  # alive but deaf to SIGTERM (stopped, hung in C code): never "gone"
                why = ("cancelled (the supervisor, pid %d, did not stop within %.0f s of SIGTERM: it was killed, "
                       "then the job's processes)" % (pid, grace + 15))
                kill_supervisor(pid)
                if (read_status(os.path.join(d, "status.json")) or {}).get("state") in TERMINAL:  # it ended meanwhile
                    return self.probe(job_id)
            pgid = int(st.get("pgid") or 0)
            if pgid > 0:
                kill_group(pgid, grace)
            processes.stop([(int(p[0]), int(p[1])) for p in st.get("procs") or []], grace)
            status = read_json(os.path.join(d, "status.json")) or {"job_id": job_id}
            status.update(state="cancelled", reason=why, ended=time.time())
            manifest_path = os.path.join(d, "manifest.json")
            atomic_write_json(manifest_path, build_manifest(d, read_json(manifest_path)), compact=True)
            atomic_write_json(os.path.join(d, "status.json"), status)
            st = self.probe(job_id)
        return st

    def fence(self, job_id: str, moved_to: str) -> Dict[str, Any]:
        """The job moved to ``moved_to``: the attempt here is superseded. Stop it as ``cancel``
        does (SIGTERM, the job's grace, SIGKILL to its whole recorded tree; Slurm: scancel),
        wait for its supervisor to end, then set its folder aside (``movejob.set_aside``) so no
        request reads it as the job's again. ``found``: there was a folder; ``state``: what the
        attempt was before; ``stopped``: it was live and has been stopped; ``kept``: where the
        folder is now. Idempotent: a second fence finds nothing."""
        d = self.job_dir(job_id)
        if not os.path.isdir(d):
            return {"found": False, "state": UNKNOWN, "stopped": False, "kept": None}
        before = self.probe(job_id)
        live = before["state"] not in TERMINAL + (LOST, UNKNOWN) or bool(before.get("unsupervised"))
        if live:
            grace = float((read_json(os.path.join(d, "job.json")) or {}).get("grace_s") or GRACE_S)
            st = self.cancel(job_id, grace)
            processes.stop(survivors_of(st), 1.0)  # nothing of the old attempt may run on
        st = read_status(os.path.join(d, "status.json")) or {}
        local = self.slurm_job(d) is None  # a Slurm job's processes are Slurm's (cancel scancelled them)
        deadline = time.time() + FINISHING_S  # its supervisor still writes its records: let it end
        while local and pid_alive(int(st.get("supervisor_pid") or 0), "supervisor") and time.time() < deadline:
            time.sleep(0.1)
        if local and (survivors_of(st) or pid_alive(int(st.get("supervisor_pid") or 0), "supervisor")):
            raise AgentError("job %s: processes of the superseded attempt do not stop; its folder is left in place"
                             % job_id)
        kept = movejob.set_aside(self.root, job_id, d, moved_to, str(before["state"]))
        return {"found": kept is not None, "state": str(before["state"]), "stopped": live, "kept": kept}

    def resume(self, job_id: str, whole_job: bool = False, values: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Respawn the supervisor. ``whole_job``: this node restarts with the others of a
        multi-node job, so a node that had succeeded restarts too. ``values``: the job's
        ``secret_env`` again, as ``launch`` takes them."""
        st = self.probe(job_id)
        recorded = read_json(os.path.join(self.job_dir(job_id), "job.json"))
        values = self.secret_values({"secrets": values}, recorded if isinstance(recorded, dict) else {})
        job = self.slurm_job(self.job_dir(job_id))
        if job is not None and st["state"] in RESUMABLE:
            said = self.resume_note(self.job_dir(job_id), recorded)
            return dict(said, slurm_job=self._slurm(slurmjob.resume, self.job_dir(job_id), job, values))
        if st.get("unsupervised"):  # the attempt whose supervisor died still runs: stop it (it checkpoints), wait
            d = self.job_dir(job_id)
            grace = float((read_json(os.path.join(d, "job.json")) or {}).get("grace_s") or GRACE_S)
            processes.stop(survivors_of(st), grace)
            if survivors_of(st):
                raise AgentError("job %s: processes of the earlier attempt do not stop; not resumed" % job_id)
            st = self.probe(job_id)
        if st["state"] not in RESUMABLE + ((SUCCEEDED,) if whole_job else ()):
            raise AgentError("job %s is %s; only a failed, lost or cancelled job can be resumed" % (job_id, st["state"]))
        d = self.job_dir(job_id)
        old = read_json(os.path.join(d, "status.json")) or {}
        old.update(state="pending", reason="resuming", supervisor_pid=None, heartbeat=time.time())
        atomic_write_json(os.path.join(d, "status.json"), old)
        said = self.resume_note(d, recorded)  # after the stop above: the checkpoint it left counts
        return dict(said, pid=self.spawn(d, int(old.get("node_rank") or 0), values))

    @staticmethod
    def resume_note(job_dir: str, recorded: Any) -> Dict[str, Any]:
        """``{"note": ...}``: what the next attempt appends to the command (``attempt.plan``,
        found in the job folder as it is now, as the supervisor will find it), or why it
        appends nothing; empty for a job without ``resume_args``."""
        args = recorded.get("resume_args") if isinstance(recorded, dict) else None
        if not args or not isinstance(args, list):
            return {}
        return {"note": attempt.plan([str(a) for a in args], job_dir).note}

    def slurm_job(self, job_dir: str) -> Optional[Dict[str, Any]]:
        """job.json of a job run through Slurm, else None."""
        job = read_json(os.path.join(job_dir, "job.json"))
        return job if isinstance(job, dict) and job.get("slurm") else None

    # -- logs and files --------------------------------------------------------------
    def log_path(self, job_id: str, node: int) -> str:
        return os.path.join(self.job_dir(job_id), "logs", "node%d.log" % node)

    def manifest(self, job_id: str) -> Dict[str, Any]:
        d = self.job_dir(job_id)
        path = os.path.join(d, "manifest.json")
        st = self.probe(job_id)
        current = read_json(path)
        if not (st["state"] in TERMINAL and isinstance(current, dict)):  # a live job: hash what changed since last time
            current = build_manifest(d, {"files": list(known_hashes(d).values())})
            keep_hashes(d, current["files"])
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

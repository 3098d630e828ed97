"""A job on a Slurm cluster, seen from the login node: submit, probe, cancel, resume
(``helper/agent.py`` calls these for a job whose job.json has a ``slurm`` section; docs/slurm.md).
Standard library only, Python >= 3.8.

Nothing of orch stays running on the login node: every call asks Slurm and reads the job
folder (on the filesystem the compute nodes share), then returns. Contracts:

- ``slurm.json`` in the job folder lists the Slurm job ids of the job's submissions (one
  per ``orch submit``/``orch resume``; a requeue keeps its id), the latest last.
- status.json is the supervisor's word while it runs in the allocation. Slurm's word decides
  what the supervisor cannot write: pending with Slurm's reason, and an end it did not live
  to record (killed at the time limit, node failure, cancelled while pending), which
  ``finalize`` then writes — under the job folder's lock, never over a terminal state.
- ``cancel.requested`` in the job folder tells the supervisor that the SIGTERM it gets is
  ``orch cancel`` (cancelled), not Slurm ending the job (time limit, preemption).
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any, Dict, List, Optional

from remote_payload.contract.jobfolder import atomic_write_json, read_json
from remote_payload.contract.protocol import (
    CANCELLED,
    FAILED,
    LOST,
    PENDING,
    RUNNING,
    SETTING_UP,
    SUCCEEDED,
    TERMINAL,
    UNKNOWN,
)
from remote_payload.contract.slurm import SlurmError, clean, orch_state
from remote_payload.jobdir.manifest import Flock, build_manifest
from remote_payload.jobdir.status import read_status
from remote_payload.slurm import clients as slurm

RECORD = "slurm.json"
SCRIPT = "slurm.sh"
CANCEL_MARK = "cancel.requested"
CLIENTS = ("sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo")  # srun runs in the allocation
FRESH_S = 10.0  # a running supervisor's heartbeat (every 2 s) younger than this: Slurm is not asked
STALE_S = 60.0  # a status.json heartbeat older than this is not taken as "running" when Slurm cannot answer


class SlurmJobError(Exception):
    """One line for the user (the agent turns it into the request's error)."""


def env_of(job: Dict[str, Any]) -> Dict[str, str]:
    env = (job.get("slurm") or {}).get("env") or {}
    return {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}


def slurm_ids(job_dir: str) -> List[str]:
    ids = (read_json(os.path.join(job_dir, RECORD)) or {}).get("jobs")
    return [i for i in ids if isinstance(i, str) and i.isdigit()] if isinstance(ids, list) else []


def host_facts(env: Dict[str, str], root: str) -> Dict[str, Any]:
    """For ``hello``: the cluster (``slurm.cluster_facts``) and the filesystem type of the
    root; ``{"problem": ...}`` when a client orch uses is missing or Slurm cannot be asked."""
    path = dict(os.environ, **env).get("PATH", os.defpath)
    missing = [c for c in CLIENTS if shutil.which(c, path=path) is None]
    if missing:
        return {"problem": "%s not found on PATH: is this a Slurm login node?" % ", ".join(missing)}
    try:
        facts = slurm.cluster_facts(env)
    except SlurmError as exc:
        return {"problem": str(exc)}
    facts["root_fs"] = fs_type(root)
    return facts


def fs_type(path: str) -> str:
    """The filesystem type of the mount holding ``path`` (from /proc/mounts; "" when unknown)."""
    path = os.path.realpath(os.path.expanduser(path))
    best, kind = "", ""
    try:
        with open("/proc/mounts", encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and (path == parts[1] or path.startswith(parts[1].rstrip("/") + "/")) \
                        and len(parts[1]) >= len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        return ""
    return clean(kind, 40)


def submit(job_dir: str, job: Dict[str, Any], secrets: Optional[Dict[str, str]] = None) -> str:
    """sbatch the job's ``slurm.sh``; record the id in ``slurm.json``. A refusal is written as
    the job's failed state (with Slurm's words) and raised as ``SlurmJobError``. ``secrets``
    (the job's ``secret_env`` values) are in sbatch's environment only, which Slurm gives the
    batch step (``supervisor/secrets.py``): never in the script or the job folder."""
    try:
        slurm_id = slurm.submit(os.path.join(job_dir, SCRIPT), dict(env_of(job), **(secrets or {})))
    except (SlurmError, ValueError) as exc:
        finalize(job_dir, FAILED, str(exc), force=True)
        raise SlurmJobError(str(exc)) from None
    atomic_write_json(os.path.join(job_dir, RECORD), {"jobs": slurm_ids(job_dir) + [slurm_id]})
    return slurm_id


def finalize(job_dir: str, state: str, reason: str, force: bool = False) -> Dict[str, Any]:
    """Write a terminal state the supervisor could not (manifest first, as a supervisor
    does), unless status.json is terminal by now (``force``: a new submission's refusal)."""
    path = os.path.join(job_dir, "status.json")
    with Flock(job_dir):
        st = read_status(path) or {}
        if st.get("state") in TERMINAL and not force:
            return st
        manifest_path = os.path.join(job_dir, "manifest.json")
        atomic_write_json(manifest_path, build_manifest(job_dir, read_json(manifest_path)), compact=True)
        st.update(state=state, reason=reason, ended=time.time())
        atomic_write_json(path, st)
        return st


def probe(job_dir: str, job: Dict[str, Any], st: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """The job's status: status.json while the supervisor speaks for it, Slurm's word
    otherwise (see the module's contracts)."""
    out: Dict[str, Any] = dict(st) if st else {"state": PENDING}
    out["log_nodes"] = len(job.get("nodes") or []) or 1
    ids = slurm_ids(job_dir)
    if ids:
        out["slurm_job"] = ids[-1]
    if out["state"] in TERMINAL or out["state"] == UNKNOWN:
        return out
    if st and st.get("state") in (SETTING_UP, RUNNING) and time.time() - float(st.get("heartbeat") or 0) < FRESH_S:
        return out  # the supervisor speaks for the job: Slurm is not asked (follow probes every second)
    if not ids:
        age = time.time() - os.stat(job_dir).st_mtime
        return dict(out, state=PENDING if age < 30 else LOST,
                    reason="being submitted to Slurm" if age < 30 else "never submitted to Slurm (submit cut off?)")
    try:
        info = slurm.query(ids[-1], env_of(job))
    except SlurmError as exc:
        fresh = st is not None and time.time() - float(st.get("heartbeat") or 0) < STALE_S
        return out if fresh else dict(out, state=UNKNOWN, reason="cannot ask Slurm: %s" % exc)
    state, reason = orch_state(info, ids[-1])
    if state == PENDING or (state == RUNNING and out["state"] == PENDING):
        where = " on %s" % info.nodelist if info and info.nodelist and state == RUNNING else ""
        reason = reason or "starting in Slurm job %s%s" % (ids[-1], where)
        said = st.get("reason") if st and st.get("state") == PENDING else None  # requeued, resuming: say so too
        return dict(out, state=PENDING, reason="%s; %s" % (said, reason) if said else reason)
    if state == RUNNING:
        return dict(out, reason=reason) if reason else out
    if state in (LOST, UNKNOWN):
        return dict(out, state=state, reason=reason)
    if state == SUCCEEDED:  # the batch script ended well, yet orch's supervisor recorded no end
        state, reason = FAILED, "the supervisor recorded no end (see logs/slurm-%s.out)" % ids[-1]
    return dict(finalize(job_dir, state, "Slurm job %s: %s" % (ids[-1], reason)), log_nodes=out["log_nodes"],
                slurm_job=ids[-1])


def cancel(job_dir: str, job: Dict[str, Any], st: Optional[Dict[str, Any]], grace: float) -> Dict[str, Any]:
    """SIGTERM to the supervisor in the allocation (it stops the job gracefully: the trainer
    checkpoints) marked as a cancel; after ``grace`` + 15 s, or at once for a job still
    pending, ``scancel``. The job ends ``cancelled`` either way."""
    ids = slurm_ids(job_dir)
    with open(os.path.join(job_dir, CANCEL_MARK), "w") as f:
        f.write("%f\n" % time.time())
    env = env_of(job)
    try:
        if ids and slurm.signal(ids[-1], "TERM", batch_only=True, env=env):
            deadline = time.time() + grace + 15
            while time.time() < deadline:
                if (read_status(os.path.join(job_dir, "status.json")) or {}).get("state") in TERMINAL:
                    break
                time.sleep(0.2)
        if ids:
            slurm.cancel(ids[-1], env)
    except SlurmError as exc:
        raise SlurmJobError("cannot cancel Slurm job %s: %s" % (ids[-1], exc)) from None
    return dict(finalize(job_dir, CANCELLED, "cancelled"), log_nodes=len(job.get("nodes") or []) or 1)


def resume(job_dir: str, job: Dict[str, Any], secrets: Optional[Dict[str, str]] = None) -> str:
    """Submit the job's batch script again (a new Slurm job: the trainer continues from the
    latest checkpoint in the job folder); returns the new Slurm job id."""
    try:
        os.unlink(os.path.join(job_dir, CANCEL_MARK))
    except FileNotFoundError:
        pass
    old = read_status(os.path.join(job_dir, "status.json")) or {}
    old.update(state=PENDING, reason="resuming: submitted to Slurm again", heartbeat=time.time(), ended=None)
    atomic_write_json(os.path.join(job_dir, "status.json"), old)
    return submit(job_dir, job, secrets)

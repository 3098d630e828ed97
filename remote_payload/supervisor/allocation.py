"""The supervisor's part inside a Slurm allocation (standard library only; docs/slurm.md).

The batch script execs ``supervisor.py`` on the allocation's first node (the batch host).
It runs setup there once, then one ``srun`` step that starts the node's argv on every node
of the allocation (torchrun with a c10d rendezvous on the batch host: the plan leaves the
endpoint as ``RDZV``, filled in here with this host's name and a port free on it).

Signals, as the batch script asks Slurm for them:
- SIGUSR1 ``signal_before_s`` before the time limit (``--signal=B:USR1@N``): the warning.
  The supervisor stops the job gracefully (``stop_steps``: the trainer checkpoints),
  then, with ``requeue``, puts the Slurm job back in the queue (``scontrol requeue``): the
  next allocation's supervisor starts the job again and the trainer continues from that
  checkpoint. Without ``requeue`` the job ends ``failed`` naming the time limit.
- SIGTERM: ``orch cancel`` (the job folder holds ``cancel.requested``) or Slurm ending the
  job (time limit reached, preemption, a user's ``scancel``): ``ended_by_slurm`` asks Slurm
  which, so the job's state names it.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Dict, List, Optional, Tuple

from remote_payload.contract.protocol import CANCELLED, FAILED, RUNNING, SUCCEEDED, TERMINAL
from remote_payload.contract.slurm import RDZV, Resources, SlurmError, orch_state, srun_argv
from remote_payload.slurm import clients as slurm
from remote_payload.slurm.job import CANCEL_MARK, env_of
from remote_payload.supervisor.direct import free_port


def step_argv(job: Dict[str, Any], job_dir: str, argv: List[str]) -> List[str]:
    """``srun`` running ``argv`` once on every node, ``RDZV`` replaced by ``<this host>:<free port>``."""
    endpoint = "%s:%d" % (socket.gethostname(), free_port())
    res = Resources(**job["slurm"]["resources"])
    return srun_argv(res, job_dir, [endpoint if a == RDZV else a for a in argv])


def slurm_job_id() -> str:
    return os.environ.get("SLURM_JOB_ID", "")


def cancel_requested(job_dir: str) -> bool:
    return os.path.exists(os.path.join(job_dir, CANCEL_MARK))


def ended_by_slurm(job: Dict[str, Any]) -> Tuple[str, str]:
    """(state, reason) for a SIGTERM that was not ``orch cancel``: what Slurm says it did."""
    job_id = slurm_job_id()
    try:
        info = slurm.query(job_id, env_of(job)) if job_id else None
    except (SlurmError, ValueError):
        info = None
    state, reason = orch_state(info, job_id) if info is not None else (RUNNING, None)
    if state == CANCELLED:
        return CANCELLED, "cancelled in Slurm (scancel %s)" % job_id
    if state in TERMINAL and state != SUCCEEDED:
        return state, "Slurm job %s: %s" % (job_id, reason)
    return FAILED, "stopped by Slurm with SIGTERM (time limit, preemption or scancel of job %s)" % (job_id or "?")


def stop_steps(job: Dict[str, Any]) -> bool:
    """SIGTERM to the job's processes on every node (every srun step; not the batch shell, which
    is the supervisor): torchrun passes it to its workers and the trainer checkpoints. srun
    itself must not get it: a signalled srun kills its step at once. False when Slurm could
    not be asked (the caller then stops srun, which ends the step)."""
    try:
        return slurm.signal(slurm_job_id(), "TERM", batch_only=False, env=env_of(job), steps_only=True)
    except (SlurmError, ValueError):
        return False


def warned_reason(job: Dict[str, Any], requeued: bool) -> str:
    """What the job's state says after the time-limit warning stopped it."""
    limit = job["slurm"]["resources"].get("time") or "?"
    if requeued:
        return "requeued at the warning before the time limit (%s): the next allocation continues from the " \
               "latest checkpoint" % limit
    return "TIMEOUT: stopped at the warning before the time limit (%s), after checkpointing; orch resume " \
           "continues from the latest checkpoint" % limit


UNSURE_EXIT = 143  # this run's exit when a requeue may not have taken: never "completed" to Slurm


def requeue(job: Dict[str, Any]) -> Tuple[int, Optional[str]]:
    """Put this Slurm job back in the queue (``scontrol requeue``; Slurm then ends this run of
    the batch script): ``(exit code for this run, None)``, or ``(0, problem)`` when it cannot.
    The exit code is 0 when Slurm said yes and ``UNSURE_EXIT`` when Slurm's own SIGTERM ended
    scontrol first: the job then stays ``pending`` (requeued), and if no requeue took, Slurm
    records this run as failed, not complete, and the login node's probe says so."""
    try:
        took = slurm.requeue(slurm_job_id(), env_of(job))
    except (SlurmError, ValueError) as exc:
        return 0, "requeue failed: %s" % exc
    return (0 if took else UNSURE_EXIT), None

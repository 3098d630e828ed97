"""Every ``ORCH_*`` environment variable of the server side, in one place: the one setting the
server reads from its own environment, the variables orch gives a job, and the one a job may set.
docs/configuration.md says each in words (tests/test_settings.py checks that they agree and that
no other server module reads an ``ORCH_`` variable from the environment).

- ``LEASE_STALL_S``: ``ORCH_LEASE_STALL_S`` in the environment orch's helper starts in (the
  login shell's) — a workspace lock whose holder makes no progress for this long is taken over.
  The laptop passes its own value with each sync (``orchestrator/settings.py``); this is the
  default for the rest. An unreadable value is a ``ValueError`` naming it (the helper reports it).
- ``JOB_*``: what the supervisor sets in a job's environment (docs/own-script.md); read back on
  the server only by ``remote_payload/report.py``, which runs inside the job.
- ``METRICS_FROM_LOG``: a job's ``env:`` may set ``ORCH_METRICS_FROM_LOG=0`` to turn the log
  watcher off (``envvars.JOB_SETTABLE``); read from the job's env, not the server's.

Standard library only (Python >= 3.8).
"""

from __future__ import annotations

import os
from typing import Mapping

LEASE_STALL = "ORCH_LEASE_STALL_S"
LEASE_STALL_DEFAULT_S = 30.0

# set by orch in every job's environment (docs/own-script.md, docs/configuration.md)
JOB_ID = "ORCH_JOB_ID"  # the job's id
JOB_DIR = "ORCH_JOB_DIR"  # its folder on this host: outputs/, checkpoints/, logs/
METRICS = "ORCH_METRICS"  # the metrics file remote_payload.report appends to
ATTEMPT = "ORCH_ATTEMPT"  # 1, 2, ... across orch resume
GPUS = "ORCH_GPUS"  # the GPUs the queue gave the job (as CUDA_VISIBLE_DEVICES)
NODE_RANK = "ORCH_NODE_RANK"  # this node's rank in a multi-node job
HOST = "ORCH_HOST"  # the inventory name of this host
PATH_FRONT = "ORCH_PATH_FRONT"  # the PATH the job's env: put first, restored after a BASH_ENV
USER_BASH_ENV = "ORCH_USER_BASH_ENV"  # the job's own BASH_ENV, sourced after orch's
JOB_VARIABLES = (JOB_ID, JOB_DIR, METRICS, ATTEMPT, GPUS, NODE_RANK, HOST, PATH_FRONT, USER_BASH_ENV)

METRICS_FROM_LOG = "ORCH_METRICS_FROM_LOG"
OFF = ("0", "false", "no", "off")


def lease_stall_s() -> float:
    """``ORCH_LEASE_STALL_S`` of this process's environment (seconds > 0; default 30)."""
    text = os.environ.get(LEASE_STALL, "").strip()
    if not text:
        return LEASE_STALL_DEFAULT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ValueError("%s=%r in the server's environment: it takes a number of seconds (unset it for the "
                         "default, %g)" % (LEASE_STALL, text, LEASE_STALL_DEFAULT_S))
    return value


def job_variable(name: str) -> str:
    """A ``JOB_VARIABLES`` value in this process's environment (inside a job), "" when unset."""
    assert name in JOB_VARIABLES, name
    return os.environ.get(name, "")


def metrics_from_log(job_env: Mapping[str, str]) -> bool:
    """Whether the job's env (``env:``) leaves the log watcher on (``ORCH_METRICS_FROM_LOG``)."""
    return job_env.get(METRICS_FROM_LOG, "").strip().lower() not in OFF

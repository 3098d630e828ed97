"""The job's environment on a node (standard library only).

Contract (docs/own-script.md, "The host's Python for every command"):

- The host's interpreter's folder (the python this supervisor runs under, which is the host's
  ``python``) and its scripts folder come first on PATH, so ``bash run.sh``, ``bash -c``,
  ``torchrun``, ``accelerate`` and ``deepspeed`` find the same environment as ``python``.
- job.yaml's ``env:`` values then apply in their order, ``$NAME``/``${NAME}`` expanded against
  the environment as it stands (``PATH: /opt/venv/bin:$PATH`` puts /opt/venv/bin before the host's
  python; remote_payload/contract/envvars.py).
- A login shell started inside the job (``bash -l``, setup's own) resets PATH from its profile;
  bash then reads ``$BASH_ENV`` after the profile, and orch's file there puts the job's front of
  PATH (``ORCH_PATH_FRONT``) back first, then sources the job's own ``BASH_ENV`` if it had one.
- ``ORCH_ATTEMPT`` is the attempt's number (1, 2, ... across ``orch resume``).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from typing import Dict, List, Mapping

from remote_payload.contract import envvars
from remote_payload.contract.jobfolder import BASH_ENV as BASH_ENV_NAME
from remote_payload.contract.jobfolder import atomic_write_text

BASH_ENV_TEXT = """\
# Written by orch: the job's front of PATH (the host's python first) survives a login shell.
if [ -n "${ORCH_PATH_FRONT:-}" ]; then
  case ":$PATH:" in
    ":$ORCH_PATH_FRONT:"*) ;;
    *) PATH="$ORCH_PATH_FRONT:$PATH"; export PATH ;;
  esac
fi
if [ -n "${ORCH_USER_BASH_ENV:-}" ] && [ -r "$ORCH_USER_BASH_ENV" ]; then . "$ORCH_USER_BASH_ENV"; fi
"""


def python_dirs(executable: str = sys.executable) -> List[str]:
    """The interpreter's own folder (as named, links not resolved: a virtualenv's ``bin``) and, for
    the running one, its scripts folder, where ``torchrun`` & co are installed; without repeats."""
    dirs = [os.path.dirname(executable)]
    try:
        scripts = sysconfig.get_path("scripts") if executable == sys.executable else ""
    except (KeyError, ValueError):
        scripts = ""
    if scripts and scripts not in dirs:
        dirs.append(scripts)
    return [d for d in dirs if d]


def with_front(path: str, front: List[str]) -> str:
    """``path`` with ``front`` first (each once)."""
    rest = [p for p in path.split(os.pathsep) if p and p not in front] if path else []
    return os.pathsep.join(front + rest)


def job_environment(base: Mapping[str, str], values: Mapping[str, str], job_dir: str, attempt: int,
                    executable: str = sys.executable) -> Dict[str, str]:
    """``base`` (the supervisor's own environment) with the host's python first on PATH, the
    job's ``env:`` values expanded in order, ``ORCH_ATTEMPT``, and ``BASH_ENV`` pointing at the
    file ``write_bash_env`` writes."""
    env = dict(base)
    server_path = env.get("PATH") or os.defpath
    env["PATH"] = with_front(server_path, python_dirs(executable))
    around = env["PATH"]
    user_bash_env = values.get("BASH_ENV") or env.get("BASH_ENV")
    env = envvars.expand_all(values, env)
    path = env.get("PATH", "")
    tail = around[len(os.pathsep.join(python_dirs(executable))):]  # the server's part, after the python dirs
    env["ORCH_PATH_FRONT"] = path[:len(path) - len(tail)].rstrip(os.pathsep) if tail and path.endswith(tail) else path
    if user_bash_env:
        env["ORCH_USER_BASH_ENV"] = envvars.expand(user_bash_env, env) if "BASH_ENV" in values else user_bash_env
    env["BASH_ENV"] = os.path.join(job_dir, BASH_ENV_NAME)
    env["ORCH_ATTEMPT"] = str(attempt)
    return env


def write_bash_env(job_dir: str) -> None:
    """The file ``BASH_ENV`` names (written before setup; the same for every job)."""
    path = os.path.join(job_dir, BASH_ENV_NAME)
    atomic_write_text(path, BASH_ENV_TEXT)

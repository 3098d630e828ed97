"""The values of a job's ``secret_env`` on a server (standard library only, Python >= 3.8).

Contract (docs/own-script.md, "Secrets"): a value is never written to a file, an argv or a log.

- job.json lists the names only (``secret_env``); the values arrive in the ``launch``,
  ``resume`` and ``adopt`` requests, and the helper refuses a request that lacks one
  (``checked``).
- The helper hands them to the supervisor it starts as one JSON object on the supervisor's
  stdin (``hand_over``); the supervisor reads it before anything else (``receive``) and puts the
  values in its own environment, so setup, the job (each launcher and its workers) and
  on_finish's webhook (``url_env``) see them, and ``/proc/<pid>/environ`` shows them only to
  their owner (and root), as for any process.
- On a Slurm login node they go to ``sbatch`` in its environment: Slurm carries a job's
  environment to the batch step (and ``srun --export=ALL`` to every node) and keeps it in its
  controller's state, which the cluster's admins can read, as they can the batch script. It
  is never in ``slurm.sh`` or the job folder.
- A supervisor started without a value job.json names fails the attempt at once, naming it
  (``lacking``); lines the supervisor writes to the log show a value as ``[secret NAME]``
  (``redact``).
"""

from __future__ import annotations

import json
from typing import IO, Any, Dict, List, Mapping

MAX_BYTES = 4 << 20  # far above what the laptop sends (1 MiB of values at most)


def checked(values: Any, names: Any) -> Dict[str, str]:
    """The request's ``values`` for job.json's ``names``: every name has a string value;
    ``ValueError`` naming what is wrong otherwise (never a value)."""
    names = names if isinstance(names, list) else []
    values = values if values is not None else {}
    if not isinstance(values, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
        raise ValueError("the secret values must be an object of strings")
    missing = [str(n) for n in names if n not in values]
    if missing:
        raise ValueError("the request lacks the value of secret_env %s: run the command from a laptop that has "
                         "it set (an orch from before secret_env?)" % ", ".join(missing))
    return {str(n): values[n] for n in names}


def hand_over(stream: IO[bytes], values: Mapping[str, str]) -> None:
    """Write ``values`` as one JSON object to ``stream`` (a new supervisor's stdin) and close
    it. A supervisor that died before reading it is not an error here: its status says so."""
    try:
        stream.write(json.dumps(dict(values)).encode("utf-8", "surrogateescape"))
        stream.close()
    except (BrokenPipeError, OSError):
        pass


def receive(stream: IO[bytes]) -> Dict[str, str]:
    """The object ``hand_over`` wrote ({} for nothing); ``ValueError`` for anything else."""
    data = stream.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError("more than %d bytes of secret values on stdin" % MAX_BYTES)
    if not data.strip():
        return {}
    values = json.loads(data.decode("utf-8", "surrogateescape"))
    return checked(values, sorted(values) if isinstance(values, dict) else [])


def lacking(job: Mapping[str, Any], environ: Mapping[str, str]) -> List[str]:
    """Names in job.json's ``secret_env`` that ``environ`` does not have."""
    names = job.get("secret_env") or []
    return [str(n) for n in names if n not in environ] if isinstance(names, list) else []


def redact(text: str, job: Mapping[str, Any], environ: Mapping[str, str]) -> str:
    """``text`` with each value of the job's ``secret_env`` (4 characters or more) replaced
    by ``[secret NAME]``."""
    names = job.get("secret_env") or []
    for name in names if isinstance(names, list) else []:
        value = environ.get(str(name)) or ""
        if len(value) >= 4 and value in text:
            text = text.replace(value, "[secret %s]" % name)
    return text

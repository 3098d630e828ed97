"""``secret_env:``: the values of the named variables, read from the laptop's environment.

Contract: the values live in memory only. They travel in the ``launch``, ``resume`` and
``adopt`` requests over the connection (never in argv, a file, job.json, ``repro/``, the
registry, ``--dry-run``/``--json`` or a message); the server hands them to each node's
supervisor on its stdin (``remote_payload/supervisor/secrets.py``), or to ``sbatch`` in its
environment on a Slurm login node. A name the laptop does not have set stops the command
before anything connects or launches (``UsageError``, exit 2), naming every missing one.
"""

from __future__ import annotations

import os
from typing import Mapping

from orchestrator.errors import RemoteError, UsageError
from orchestrator.spec.model import MAX_ENV_TOTAL, MAX_ENV_VALUE, size_text
from orchestrator.state.registry import JobRecord


def read(names: list[str], what: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{name: value}`` for every name from ``environ`` (the laptop's own by default).
    ``what`` names the command for the message (``orch submit``, ``orch resume JOB``)."""
    environ = os.environ if environ is None else environ
    missing = [n for n in names if n not in environ]
    if missing:
        raise UsageError(f"secret_env: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set in this "
                         f"laptop's environment; {what} reads {'it' if len(missing) == 1 else 'them'} there and sends "
                         f"the value{'s' if len(missing) > 1 else ''} to the job (never to a file): export "
                         f"{missing[0]}=... and run it again")
    values = {n: environ[n] for n in names}
    for name, value in values.items():
        if len(value.encode("utf-8", "surrogateescape")) > MAX_ENV_VALUE:
            raise UsageError(f"secret_env: ${name} is larger than an environment variable may be "
                             f"({size_text(MAX_ENV_VALUE)}): put it in a file and pass the file's path")
    if sum(len(k) + len(v) + 2 for k, v in values.items()) > MAX_ENV_TOTAL:
        raise UsageError(f"secret_env: the values are more than {size_text(MAX_ENV_TOTAL)} together")
    return values


def recorded(asked: list[str], record: JobRecord, what: str) -> dict[str, str]:
    """``read`` for a job submitted earlier (``orch resume``, ``rerun``, a move), whose spec
    now comes from a server or a copy: only names its submit recorded on this laptop are read
    (a server never chooses which of the laptop's variables it gets)."""
    unknown = [n for n in asked if n not in record.secret_env]
    if unknown:
        raise RemoteError(f"{record.job_id}: its recorded spec asks for secret_env {', '.join(unknown)}, which its "
                          "submit from this laptop did not: nothing was sent (was the spec changed on the server?)")
    return read(asked, what)

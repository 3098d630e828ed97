"""``env:`` values of a job file: ``$NAME`` and ``${NAME}`` expand from the job's environment on
the server, ``$$`` is one ``$``; any other ``$`` is refused when the file is read.

``ORCH_`` names are orch's own (``reserved``): orch sets them for the job (``ORCH_JOB_DIR``,
``ORCH_METRICS``, ``ORCH_ATTEMPT``, ...), reads them on the server, or its tests use them, so
a job's ``env:``, ``secret_env:`` and sweep values may not set them — the whole prefix, so
that a name orch adds later is refused without anyone listing it. ``JOB_SETTABLE`` are the
exceptions documented for a job to set.

One rule for both sides: the laptop checks a value with ``problem`` (a spec error, exit 2), the
supervisor expands the values in their order with ``expand_all`` — ``PATH: /opt/venv/bin:$PATH``
reads the PATH the job would have had (the host's python first, docs/own-script.md), and a value
may use a variable set above it in the same ``env:``. A name that is not set expands to nothing,
as in a shell. Standard library only (Python >= 3.8).
"""

from __future__ import annotations

import re
from typing import Dict, Mapping, Optional

_TOKEN = re.compile(r"\$(?:\$|([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)\})")
JOB_SETTABLE = ("ORCH_METRICS_FROM_LOG",)  # docs/own-script.md: a job turns the log watcher off
RULE = "only $NAME, ${NAME} (from the job's environment on the server) and $$ (one $) are read in env values"


def problem(value: str) -> Optional[str]:
    """Why ``value`` cannot be expanded (a ``$`` that is none of the three forms), or None."""
    rest = _TOKEN.sub("", value)
    if "$" not in rest:
        return None
    at = rest.index("$")
    return "%r: %s; write $$ for a literal $" % (rest[at:at + 12], RULE)


def reserved(name: str) -> Optional[str]:
    """Why a job may not set the environment variable ``name`` (an ``ORCH_`` name that is not
    in ``JOB_SETTABLE``), or None when it may."""
    if not name.startswith("ORCH_") or name in JOB_SETTABLE:
        return None
    return "ORCH_ variables are orch's own (a job may set only %s)" % ", ".join(JOB_SETTABLE)


def expand(value: str, env: Mapping[str, str]) -> str:
    """``value`` with its variables read from ``env`` (checked by ``problem`` first)."""
    def one(m: "re.Match[str]") -> str:
        name = m.group(1) or m.group(2)
        return "$" if name is None else env.get(name, "")
    return _TOKEN.sub(one, value)


def expand_all(values: Mapping[str, str], env: Dict[str, str]) -> Dict[str, str]:
    """``env`` updated with ``values`` in their order, each expanded against ``env`` as it stands
    (so a later value sees an earlier one)."""
    out = dict(env)
    for key, value in values.items():
        out[key] = expand(value, out)
    return out

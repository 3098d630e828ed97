"""Files of the laptop's workspace that decide how a command is launched: the accelerate config
file an ``accelerate launch --config_file F`` command names, so its process count counts
(plan/launchers.py ``with_config``), and the shell script the command runs, so a launcher
inside it is seen (plan/hidden.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from orchestrator.plan import hidden, launchers
from orchestrator.spec import commandform
from orchestrator.spec.model import JobSpec

MAX_CONFIG_BYTES = 1 << 20


def counted(spec: JobSpec, workspace: Path) -> JobSpec:
    """``spec`` with the config file's processes per node where it decides them; unchanged when
    there is no such file in the workspace (it may live only on the server) or it is not a
    YAML/JSON mapping."""
    name = launchers.config_file(spec)
    if name is None or name.startswith("/"):
        return spec
    path = workspace / name
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            return spec
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return spec
    return launchers.with_config(spec, data if isinstance(data, dict) else None)


def script(spec: JobSpec, workspace: Path) -> str | None:
    """The text of the workspace script ``launch.command`` runs (``bash run.sh``, ``./run.sh``;
    ``hidden.script_path``, below the command's ``cd DIR``), or None: no such command, a file
    the workspace lacks or cannot give as text, or one over ``hidden.MAX_SCRIPT``."""
    if spec.launch.command is None:
        return None
    form = commandform.read(list(spec.launch.command))
    name = hidden.script_path(list(form.argv))
    if name is None or (form.cwd or "").startswith(("/", "~")):
        return None
    path = workspace / (form.cwd or "") / name
    try:
        if not path.is_file() or path.stat().st_size > hidden.MAX_SCRIPT:
            return None
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None

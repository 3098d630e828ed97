"""The accelerate config file an ``accelerate launch --config_file F`` command names, read from
the laptop's workspace, so its process count counts (plan/launchers.py ``with_config``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from orchestrator.plan import launchers
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

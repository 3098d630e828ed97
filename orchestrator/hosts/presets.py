"""Provider presets: plain data that plans and host entries apply (docs/providers.md).

A preset may set environment variables, wrap the setup step, and suggest a host root.
Add a provider by adding an entry here and a line in docs/providers.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Preset:
    env: dict[str, str] = field(default_factory=dict)
    setup_prefix: str = ""
    root: str | None = None
    shutdown_argv: tuple[str, ...] | None = None
    help: str = ""


PRESETS: dict[str, Preset] = {
    "autodl": Preset(
        env={"HF_HOME": "/root/autodl-tmp/hf"},
        root="/root/autodl-tmp/orch",
        shutdown_argv=("shutdown",),
        help="AutoDL: everything on the data disk /root/autodl-tmp; `shutdown` stops billing.",
    ),
    "runpod": Preset(
        root="/workspace/orch",
        shutdown_argv=("sh", "-c", 'runpodctl stop pod "$RUNPOD_POD_ID"'),
        help="RunPod: orch on the /workspace volume (kept over a stop); `runpodctl stop pod` stops billing.",
    ),
    "autodl-network-turbo": Preset(
        setup_prefix="source /etc/network_turbo\n",
        help="AutoDL's academic proxy, around the setup step only.",
    ),
    "hf-mirror": Preset(
        env={"HF_ENDPOINT": "https://hf-mirror.com", "HF_HUB_DISABLE_XET": "1"},
        help="Hugging Face downloads through hf-mirror.com.",
    ),
    "pip-mirror": Preset(
        env={"PIP_INDEX_URL": "https://pypi.tuna.tsinghua.edu.cn/simple"},
        help="pip through a mirror; override PIP_INDEX_URL in env: to choose another.",
    ),
}


def preset_env(names: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for name in names:
        env.update(PRESETS[name].env)
    return env


def preset_setup(names: list[str], setup: str | None) -> str | None:
    if not setup:
        return setup
    return "".join(PRESETS[name].setup_prefix for name in names) + setup

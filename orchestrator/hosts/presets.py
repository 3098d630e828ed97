"""Presets applied: the environment and the setup step a host's and a job's presets give
(docs/providers.md). The presets themselves are plain data in ``orchestrator/providers/registry.py``
(``PRESETS``: each provider's own, then the network and mirror ones).
"""

from __future__ import annotations

from orchestrator.providers.registry import PRESETS


def preset_env(names: list[str]) -> dict[str, str]:
    """The variables of ``names`` merged in order: a later preset wins."""
    env: dict[str, str] = {}
    for name in names:
        env.update(PRESETS[name].env)
    return env


def preset_setup(names: list[str], setup: str | None) -> str | None:
    """``setup`` with the presets' prefixes before it; no setup stays none (a prefix alone runs nothing)."""
    if not setup:
        return setup
    return "".join(PRESETS[name].setup_prefix for name in names) + setup

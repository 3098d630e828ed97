"""The providers orch rents from, and the presets a host or a job may name, as plain data: the
one place a provider's facts live.

Everything else reads them from here: the inventory's accepted provider names
(``hosts/inventory.py``), ``orch hosts add --provider`` and ``orch rent --provider`` with rent's
defaults (token variable, image, root, presets), the ``presets:`` names of a job file
(``spec/model.py``, ``orch schema``), the presets a plan applies (``hosts/presets.py``) and the
adapter ``providers/open.py`` builds.

This module imports nothing of orch (a contract in pyproject.toml), so that ``hosts`` and
``spec``, which sit below ``providers``, may read it; an adapter's module is imported only when
``ProviderEntry.adapter`` is asked for it.

Adding a provider: one module with its adapter (a ``Provider`` subclass of
``providers/api.py`` whose ``name`` is the entry's name, built as ``Adapter(token, api_url)``)
and one ``ProviderEntry`` in ``PROVIDERS`` (docs/providers.md).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Preset:
    """Settings a host or job takes by name: ``env`` for setup and the job (the job's ``env:``
    wins), ``setup_prefix`` shell run before the job's setup (only when there is one), ``root``
    the host root ``orch hosts add --preset`` suggests, ``shutdown_argv`` how the box powers
    itself off, ``help`` one line."""

    env: dict[str, str] = field(default_factory=dict)
    setup_prefix: str = ""
    root: str | None = None
    shutdown_argv: tuple[str, ...] | None = None
    help: str = ""


@dataclass(frozen=True)
class ProviderEntry:
    """One provider. ``adapter``: ``"module:Class"`` of its ``Provider`` subclass, imported on
    first use. ``token_env``: the variable its API token is read from by default (``orch rent``;
    ``hosts add`` asks for one). ``currency``: what its prices are in. ``image``: the container
    image ``orch rent`` starts, None where orch does not rent (the instance is added with
    ``orch hosts add --provider``). ``preset``: the provider's own preset, named like the
    provider; its ``root`` is where orch keeps its files on a rented box. ``interruptible``:
    its API rents interruptible (spot) instances by a bid (``orch rent --interruptible``);
    ``no_interruptible`` says why not where it does not."""

    name: str
    adapter: str
    token_env: str
    currency: str
    image: str | None = None
    preset: Preset | None = None
    interruptible: bool = False
    no_interruptible: str = ""

    @property
    def rentable(self) -> bool:
        """``orch rent --provider`` offers it."""
        return self.image is not None

    @property
    def root(self) -> str | None:
        """orch's root on a box of this provider; None: the inventory's default."""
        return self.preset.root if self.preset is not None else None

    @property
    def presets(self) -> list[str]:
        """The presets a rented box's host entry carries: the provider's own, where it has one."""
        return [self.name] if self.preset is not None else []

    def load(self) -> Any:
        """The adapter class (``Adapter(token, api_url)`` builds the provider), imported now."""
        module, _, attribute = self.adapter.partition(":")
        return getattr(importlib.import_module(module), attribute)


_PROVIDERS = (
    ProviderEntry(
        name="autodl",
        adapter="orchestrator.providers.autodl:AutoDL",
        token_env="AUTODL_TOKEN",
        currency="CNY",
        image="base-image-l2t43iu6uk",  # AutoDL's PyTorch 2.0.0 / CUDA 11.8 base image (docs/providers.md)
        no_interruptible="AutoDL has no interruptible instances: its API documents no bid, spot or preemptible "
        "rental (docs/providers.md)",
        preset=Preset(
            env={"HF_HOME": "/root/autodl-tmp/hf"},
            root="/root/autodl-tmp/orch",
            shutdown_argv=("shutdown",),
            help="AutoDL: everything on the data disk /root/autodl-tmp; `shutdown` stops billing.",
        ),
    ),
    ProviderEntry(
        name="vast",
        adapter="orchestrator.providers.vast:Vast",
        token_env="VAST_API_KEY",
        currency="USD",
        image="pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
        interruptible=True,
    ),
    ProviderEntry(
        name="runpod",
        adapter="orchestrator.providers.runpod:RunPod",
        token_env="RUNPOD_API_KEY",
        currency="USD",
        image="runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04",
        interruptible=True,
        preset=Preset(  # a stopped pod keeps only its volume at /workspace
            root="/workspace/orch",
            shutdown_argv=("sh", "-c", 'runpodctl stop pod "$RUNPOD_POD_ID"'),
            help="RunPod: orch on the /workspace volume (kept over a stop); `runpodctl stop pod` stops billing.",
        ),
    ),
)

PROVIDERS: dict[str, ProviderEntry] = {entry.name: entry for entry in _PROVIDERS}
"""Every provider by name, in the order the CLI lists them."""

NAMES: tuple[str, ...] = tuple(PROVIDERS)
RENTABLE: tuple[str, ...] = tuple(entry.name for entry in _PROVIDERS if entry.rentable)

OTHER_PRESETS: dict[str, Preset] = {
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
"""Presets that are no provider's own: networks and mirrors."""

PRESETS: dict[str, Preset] = {
    **{entry.name: entry.preset for entry in _PROVIDERS if entry.preset is not None},
    **OTHER_PRESETS,
}
"""Every preset by name: each provider's own, then the others (docs/providers.md)."""

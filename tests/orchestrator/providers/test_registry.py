"""The provider registry (``orchestrator/providers/registry.py``) is the one place a provider's
facts live: every list of providers or presets elsewhere is read from it, each entry's adapter
builds that provider, and the registry itself is plain data that imports nothing of orch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import click
import pytest
from pydantic import ValidationError

from orchestrator.cli.hosts import add_cmd
from orchestrator.cli.rent import rent_cmd
from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import ProviderRef
from orchestrator.providers import registry
from orchestrator.providers.api import Provider
from orchestrator.providers.open import open_named
from orchestrator.providers.registry import NAMES, PRESETS, PROVIDERS, RENTABLE
from orchestrator.spec.model import JobSpec
from tests.support.orch import Orch

REPO = Path(__file__).resolve().parents[3]


def _choices(command: click.Command, option: str) -> list[str]:
    [param] = [p for p in command.params if p.name == option]
    assert isinstance(param.type, click.Choice)
    return list(param.type.choices)


def test_the_cli_the_inventory_and_the_job_schema_accept_exactly_the_registrys_names() -> None:
    assert NAMES == ("autodl", "vast", "runpod")  # the order every listing and error shows
    assert _choices(add_cmd, "provider") == list(NAMES)
    assert _choices(rent_cmd, "provider") == list(RENTABLE) == [e.name for e in PROVIDERS.values() if e.image]
    assert ProviderRef.model_json_schema()["properties"]["name"]["enum"] == list(NAMES)
    for name in NAMES:
        assert ProviderRef(name=name, instance="i-1", token_env="T").name == name
    with pytest.raises(ValidationError, match="Input should be 'autodl', 'vast' or 'runpod'"):
        ProviderRef(name="lambda", instance="i-1", token_env="T")
    with pytest.raises(UsageError, match=r"unknown provider 'lambda' \(known: autodl, vast, runpod\)"):
        open_named("lambda", "T", None)
    assert _choices(add_cmd, "presets") == sorted(PRESETS)
    presets = JobSpec.model_json_schema()["properties"]["presets"]["items"]
    assert presets["enum"] == sorted(PRESETS)


def test_each_providers_own_preset_is_a_preset_under_its_name_and_gives_its_root() -> None:
    for entry in PROVIDERS.values():
        if entry.preset is None:
            assert entry.name not in PRESETS and entry.presets == [] and entry.root is None
        else:
            assert PRESETS[entry.name] is entry.preset and entry.presets == [entry.name]
            assert entry.root == entry.preset.root
    assert PROVIDERS["runpod"].root == "/workspace/orch" and PROVIDERS["autodl"].root == "/root/autodl-tmp/orch"
    assert set(registry.OTHER_PRESETS) <= set(PRESETS) and not set(registry.OTHER_PRESETS) & set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_an_entrys_adapter_builds_that_provider_with_the_token_of_its_variable(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = PROVIDERS[name]
    adapter = entry.load()
    assert isinstance(adapter, type) and issubclass(adapter, Provider) and adapter.name == name
    monkeypatch.setenv(entry.token_env, "token-of-the-test")
    provider = open_named(name, entry.token_env, "http://127.0.0.1:1")
    assert type(provider) is adapter and provider.name == name


def test_the_registry_imports_nothing_of_orch_and_no_adapter_until_one_is_built() -> None:
    tree = ast.parse((REPO / "orchestrator/providers/registry.py").read_text())
    imported = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert imported and not [m for m in imported if m.split(".")[0] in ("orchestrator", "remote_payload")]
    probe = ("import sys, orchestrator.providers.registry as r; "
             "print(sorted(m for m in sys.modules if m.startswith(('orchestrator', 'remote_payload'))))")
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == str(["orchestrator", "orchestrator.providers", "orchestrator.providers.registry"])


def _provider_names_spelled_out(path: Path) -> list[str]:
    """``file:line`` of each string constant in ``path`` that is exactly a provider's name."""
    tree = ast.parse(path.read_text())
    return [f"{path.relative_to(REPO)}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES]


def test_no_laptop_module_but_the_registry_and_each_adapter_spells_out_a_providers_name() -> None:
    """Adding a provider is its adapter module and one registry entry: no other module keeps a list
    of providers to extend (the adapter's ``name`` is checked against its entry above)."""
    spelled = [hit for path in sorted((REPO / "orchestrator").rglob("*.py")) for hit in _provider_names_spelled_out(path)]
    own = {"orchestrator/providers/registry.py"}
    own |= {entry.adapter.partition(":")[0].replace(".", "/") + ".py" for entry in PROVIDERS.values()}
    assert spelled and [hit for hit in spelled if hit.split(":")[0] not in own] == []


def test_orch_rent_and_hosts_add_refuse_a_provider_outside_the_registry_naming_its_choices(orch: Orch) -> None:
    rent = orch("rent", "g1", "--provider", "lambda", "--gpu", "RTX_4090", check=2)
    assert "'lambda' is not one of " + ", ".join(repr(n) for n in RENTABLE) in rent.stderr
    added = orch("hosts", "add", "p1", "--provider", "lambda", "--instance", "i", "--token-env", "T", check=2)
    assert "'lambda' is not one of " + ", ".join(repr(n) for n in NAMES) in added.stderr
    assert not (orch.home / "hosts" / "p1.json").exists() and not (orch.home / "hosts" / "g1.json").exists()

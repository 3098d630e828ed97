"""The pure parts of ``orch instances`` (``providers/accounts.py``, ``cli/instances.py``): the
accounts the entries name, the commands printed for an instance, the lines for an account that
cannot list. The listing itself is tested through the CLI (tests/e2e/provider/test_instances.py)."""

from __future__ import annotations

import shlex

import pytest

from orchestrator.cli.instances import lines_of
from orchestrator.hosts.inventory import Host, ProviderRef
from orchestrator.providers.accounts import Account, Holding, accounts_of, commands_for
from orchestrator.providers.api import Instance


def test_each_account_the_entries_name_is_listed_once() -> None:
    def entry(name: str, provider: str, token_env: str, api_url: str | None = None) -> Host:
        return Host(name=name, provider=ProviderRef(name=provider, instance=f"i-{name}", token_env=token_env,
                                                    api_url=api_url))  # type: ignore[arg-type]

    hosts = [entry("a", "vast", "VAST_API_KEY"), entry("b", "vast", "VAST_API_KEY"), Host(name="plain"),
             entry("c", "vast", "OTHER_KEY"), entry("d", "autodl", "AUTODL_TOKEN", "https://proxy.example")]
    assert accounts_of(hosts) == [Account("autodl", "AUTODL_TOKEN", "https://proxy.example"),
                                  Account("vast", "OTHER_KEY"), Account("vast", "VAST_API_KEY")]


def test_an_unknown_autodl_instance_is_added_with_its_preset_and_powered_off_before_its_release() -> None:
    found = Instance(id="pro-4a1c2b3d", state="running", status="running")
    do = commands_for(Account("autodl", "AUTODL_TOKEN"), found, host="", name="autodl-pro-4a1c2b3d")
    add = ("orch hosts add autodl-pro-4a1c2b3d --provider autodl --instance pro-4a1c2b3d --token-env AUTODL_TOKEN "
           "--preset autodl")
    assert (do.add, do.power_off) == (add, f"{add} && orch down autodl-pro-4a1c2b3d")
    assert do.release == f"{add} && orch down autodl-pro-4a1c2b3d && orch release autodl-pro-4a1c2b3d"
    known = commands_for(Account("vast", "K"), found, host="g1", name="")
    assert (known.add, known.power_off, known.release) == ("", "orch down g1", "orch release g1")
    off = Instance(id="pro-5", state="off", status="shutdown")
    unknown_off = commands_for(Account("autodl", "AUTODL_TOKEN"), off, host="", name="a5")
    assert unknown_off.power_off == "" and unknown_off.release.endswith(" --preset autodl && orch release a5")
    assert commands_for(Account("autodl", "AUTODL_TOKEN"), off, host="a5", name="").power_off == ""


def test_a_providers_id_is_quoted_so_the_printed_command_runs_nothing_else() -> None:
    hostile = Instance(id="7; touch /tmp/pwned", state="running", status="running")
    do = commands_for(Account("vast", "K", "http://127.0.0.1:9"), hostile, host="", name="vast-7")
    assert shlex.split(do.add)[6:8] == ["--instance", "7; touch /tmp/pwned"]


def test_an_account_that_cannot_list_is_one_line_and_no_failure() -> None:
    lines = lines_of([Holding(Account("runpod", "RUNPOD_API_KEY"),
                              error="listing the account's instances is not available", not_supported=True),
                      Holding(Account("vast", "VAST_API_KEY"))], width=None)
    assert lines == ["runpod $RUNPOD_API_KEY: listing the account's instances is not available (not supported)",
                     "vast $VAST_API_KEY: no instances"]


@pytest.mark.parametrize(("state", "gpu_held", "bills"), [
    ("running", False, True), ("starting", False, True), ("stopping", False, True), ("creating", False, True),
    ("failed", False, True), ("off", True, True), ("off", False, False), ("released", False, False),
    ("unknown", False, True)])
def test_an_instance_bills_unless_it_is_off_without_its_gpu_or_released(state: str, gpu_held: bool,
                                                                      bills: bool) -> None:
    assert Instance(id="1", state=state, status="", gpu_held=gpu_held).bills is bills  # type: ignore[arg-type]

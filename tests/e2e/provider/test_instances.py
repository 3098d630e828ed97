"""Nothing billing unnoticed, and a provider's error kept on its hosts (issue 37 items 4 and 7),
through the CLI against the vast stand-in (real HTTP, real sshd instances; AutoDL's and
RunPod's accounts listed through theirs): ``orch instances`` marks an instance rented outside
orch as billing and unknown, its commands add and release it, a failing account is one line
and sets the exit code; ``orch status`` with a rotated token still shows every job, the
provider host's with the provider's words, and says an unknown billing instance once a day."""

from __future__ import annotations

import json
import shlex
import urllib.request
from typing import Any

import pytest

from orchestrator.api import Orch as PythonOrch
from orchestrator.providers.accounts import CHECK_FILE, WARN_EVERY_S
from tests.support.orch import Orch
from tests.support.poll import wait_until
from tests.support.standin.autodl import AutoDLStandin
from tests.support.standin.runpod import RunPodStandin
from tests.support.standin.vast import VastStandin

KEY = "ORCH_TEST_VAST_KEY"


def standin_call(vast: VastStandin, action: str, **args: Any) -> dict[str, Any]:
    """A test-only call of the stand-in (``/standin/ACTION``, no key)."""
    req = urllib.request.Request(f"{vast.url}/standin/{action}", data=json.dumps(args).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=30) as answer:
        return json.loads(answer.read())


def from_the_console(vast: VastStandin, label: str) -> str:
    """An instance rented in vast's web console, not by orch (the stand-in's ``console_create``)."""
    return str(standin_call(vast, "console_create", label=label)["created"])


def add_vast_host(orch: Orch, vast: VastStandin, name: str, instance: str, token_env: str = KEY) -> None:
    orch("hosts", "add", name, "--provider", "vast", "--instance", instance, "--token-env", token_env,
         "--api-url", vast.url)


def test_an_instance_rented_outside_orch_is_listed_as_billing_unknown_and_its_commands_work(
        orch: Orch, vast: VastStandin, monkeypatch: pytest.MonkeyPatch) -> None:
    orch.env[KEY] = vast.token
    known = from_the_console(vast, "known-box")
    stray = from_the_console(vast, "Forgotten In The Console")
    add_vast_host(orch, vast, "k1", known)
    wait_until(lambda: all(vast.boxes[b].status == "running" for b in (known, stray)),
               what="both console instances running", timeout=60)  # so two listings agree

    table = orch("instances")
    rows = [line for line in table.stdout.splitlines() if line.startswith(f"vast ${KEY} @ {vast.url} ")]
    row = next(line for line in rows if f" {stray} " in line)
    assert row.startswith(f"vast ${KEY}") and "billing, unknown to orch" in row and "USD/h" in row
    assert " k1 " in next(line for line in rows if f" {known} " in line)
    assert f"{known} (k1): power off: orch down k1 · release: orch release k1" in table.stdout
    add = (f"orch hosts add forgotten-in-the-console --provider vast --instance {stray} --token-env {KEY} "
           f"--api-url {vast.url}")
    assert f"  add:       {add}" in table.stdout
    assert f"  release:   {add} && orch release forgotten-in-the-console" in table.stdout
    assert "  by hand:   https://cloud.vast.ai/instances/" in table.stdout

    (account,) = orch.json("instances")
    assert (account["provider"], account["token_env"], account["api_url"], account["error"]) == (
        "vast", KEY, vast.url, None)
    listed = {i["id"]: i for i in account["instances"]}
    assert listed[known]["host"] == "k1" and not listed[known]["unknown_billing"]
    assert listed[stray]["host"] is None and listed[stray]["unknown_billing"] and listed[stray]["billing"]
    assert listed[stray]["label"] == "Forgotten In The Console" and listed[stray]["age_s"] is not None
    assert listed[stray]["commands"]["add"] == add

    monkeypatch.setenv(KEY, vast.token)
    through_api = [h.as_json() for h in PythonOrch(home=orch.home).instances()]
    for found in (through_api, [account]):
        for item in found[0]["instances"]:
            item.pop("age_s")
    assert through_api == [account]

    orch(*shlex.split(add)[1:])  # the printed command, as a person would paste it
    (account,) = orch.json("instances")
    assert {i["id"]: i["host"] for i in account["instances"]}[stray] == "forgotten-in-the-console"
    for name in ("forgotten-in-the-console", "k1"):
        orch("release", name, "--yes")
    assert not {known, stray} & set(vast.billing())
    (account,) = orch.json("instances", "--provider", "vast", "--token-env", KEY, "--api-url", vast.url)
    assert not {known, stray} & {i["id"] for i in account["instances"]}


def test_an_account_that_fails_is_one_line_and_the_others_are_still_listed(orch: Orch, vast: VastStandin) -> None:
    orch.env.update({KEY: vast.token, "ORCH_TEST_ROTATED_KEY": "rotated-" + vast.token})
    stray = from_the_console(vast, "still-billing")
    add_vast_host(orch, vast, "old", "81999999", token_env="ORCH_TEST_ROTATED_KEY")
    add_vast_host(orch, vast, "gone", "81999998", token_env="ORCH_TEST_UNSET_KEY")

    refused = orch("instances", check=3)  # the first failed account's code: its key refused
    assert f"vast $ORCH_TEST_ROTATED_KEY @ {vast.url}: error: vast instances: the token was refused (HTTP 404)" \
        in refused.stdout
    assert f"vast $ORCH_TEST_UNSET_KEY @ {vast.url}: error: the vast token variable $ORCH_TEST_UNSET_KEY is not set" \
        in refused.stdout
    assert "2 of 2 provider accounts could not be listed" in refused.stderr
    add_vast_host(orch, vast, "new", stray)  # the same account with the good key
    mixed = orch("instances", check=3)
    assert f"{stray} (new): power off: orch down new" in mixed.stdout
    assert "2 of 3 provider accounts could not be listed" in mixed.stderr
    accounts = {a["token_env"]: a for a in orch.json("instances", check=3)}
    assert accounts["ORCH_TEST_ROTATED_KEY"]["exit_code"] == 3 and accounts["ORCH_TEST_UNSET_KEY"]["exit_code"] == 2
    assert stray in {i["id"] for i in accounts[KEY]["instances"]}
    orch("release", "new", "--yes")
    assert stray not in vast.billing()


def test_an_unknown_instance_whose_container_exited_is_still_listed_as_billing(orch: Orch, vast: VastStandin) -> None:
    """vast keeps an exited instance rented (its GPU held) until it is destroyed: orch calls it
    failed, and an unknown one is billing, unknown to orch, with the release that ends it."""
    orch.env[KEY] = vast.token
    standin_call(vast, "exit_on_start", status_msg="Error response from daemon: OCI runtime create failed")
    stray = from_the_console(vast, "exits-at-once")
    wait_until(lambda: vast.boxes[stray].status == "exited", what="the console instance to exit", timeout=60)
    (account,) = orch.json("instances", "--provider", "vast", "--token-env", KEY, "--api-url", vast.url)
    found = {i["id"]: i for i in account["instances"]}[stray]
    assert (found["state"], found["billing"], found["unknown_billing"]) == ("failed", True, True), found
    assert found["status"].startswith("exited: Error response from daemon"), found
    assert stray in vast.billing()
    orch(*shlex.split(found["commands"]["release"].partition(" && ")[0])[1:])
    orch("release", found["commands"]["release"].rpartition(" ")[2], "--yes")
    assert stray not in vast.billing()


def sleeper(orch: Orch, name: str, host: str) -> str:
    """Submit a job that sleeps on ``host``; its id."""
    ws = orch.cwd / f"ws-{name}"
    ws.mkdir()
    (ws / "nap.py").write_text("import time\nprint('napping', flush=True)\ntime.sleep(600)\n")
    job = orch.cwd / f"{name}.yaml"
    job.write_text(f"name: {name}\nhosts: [{host}]\nworkspace: {{path: {ws.name}}}\n"
                   "launch: {nproc_per_node: 1, command: python3 nap.py}\n")
    return str(orch.json("submit", job.name)["job_id"])


def rent(orch: Orch, vast: VastStandin, name: str) -> str:
    """``orch rent NAME`` on the stand-in, logging in as the new instance's own user; its id."""
    user = vast.next_user()
    orch("rent", name, "--provider", "vast", "--gpu", "RTX_4090", "--token-env", KEY, "--api-url", vast.url,
         "--python", "/usr/bin/python3", "--yes", "--user", user, "--root", "~/orch")
    (instance,) = [b for b in vast.boxes if vast.boxes[b].user == user]
    return instance


def test_a_rotated_token_leaves_every_other_hosts_jobs_in_status_and_an_unknown_instance_is_said_once_a_day(
        orch: Orch, vast: VastStandin, monkeypatch: pytest.MonkeyPatch) -> None:
    orch.env[KEY] = vast.token
    rented = rent(orch, vast, "v1")
    stray = from_the_console(vast, "console-box")
    on_vast, on_local = sleeper(orch, "far", "v1"), sleeper(orch, "near", "local")

    first = orch("status")  # the first status that asks v1 looks at its account too
    warning = f"warning: the vast account of ${KEY} holds instance {stray} ("
    assert warning in first.stderr and "billing, unknown to orch: `orch instances` says how" in first.stderr
    for job in (on_vast, on_local):
        assert orch.wait_state(job, ("running",))["state"] == "running"
    assert warning not in orch("status").stderr  # said once a day
    checks = json.loads((orch.home / CHECK_FILE).read_text())
    (times,) = checks.values()
    times["warned"] -= WARN_EVERY_S
    times["checked"] -= WARN_EVERY_S
    (orch.home / CHECK_FILE).write_text(json.dumps({next(iter(checks)): times}))
    assert warning in orch("status").stderr  # a day later: said again

    rotated = {KEY: "rotated-" + vast.token}
    shown = orch("status", "--wide", env=rotated)  # exit 0: the overview is whole
    words = "v1: vast instance: the token was refused (HTTP 404)"
    assert f"warning: {words}" in shown.stderr
    rows = {line.split()[0]: line for line in shown.stdout.splitlines()[1:]}
    assert "running (stale)" in rows[on_vast] and words in rows[on_vast]
    assert "running" in rows[on_local] and "stale" not in rows[on_local] and "token" not in rows[on_local]
    listed = {s["job_id"]: s for s in orch.json("status", env=rotated)}
    assert listed[on_vast]["stale"] and listed[on_vast]["provider_error"].startswith(words)
    assert listed[on_local]["state"] == "running" and "provider_error" not in listed[on_local]

    monkeypatch.setenv(KEY, "rotated-" + vast.token)
    heard: list[str] = []
    api = {s.job_id: s for s in PythonOrch(home=orch.home, say=heard.append).status()}  # type: ignore[union-attr]
    assert api[on_vast].as_json()["provider_error"].startswith(words) and api[on_local].state == "running"
    assert any(words in line for line in heard)

    for job in (on_vast, on_local):
        orch("cancel", job)
    calls = len(vast.calls)
    orch("status")  # every job finished: no provider is asked, not even for the daily look
    assert vast.calls[calls:] == []
    orch("release", "v1", "--yes")
    orch("hosts", "add", "stray", "--provider", "vast", "--instance", stray, "--token-env", KEY, "--api-url", vast.url)
    orch("release", "stray", "--yes")
    assert not {rented, stray} & set(vast.billing())


def test_autodl_and_runpod_accounts_are_listed_through_their_adapters(orch: Orch, autodl: AutoDLStandin,
                                                                      runpod: RunPodStandin) -> None:
    orch.env.update({"ORCH_TEST_AUTODL_TOKEN": autodl.token, "ORCH_TEST_RUNPOD_KEY": runpod.token})
    (held,) = orch.json("instances", "--provider", "autodl", "--token-env", "ORCH_TEST_AUTODL_TOKEN",
                        "--api-url", autodl.url)
    assert held["error"] is None and {i["id"] for i in held["instances"]} == set(autodl.boxes)
    for item in held["instances"]:  # the stand-in's instances are powered off: unknown, not billing
        assert (item["state"], item["host"], item["billing"], item["unknown_billing"]) == ("off", None, False, False)
        assert item["commands"]["power_off"] is None and "--preset autodl" in item["commands"]["add"]
    table = orch("instances", "--provider", "runpod", "--token-env", "ORCH_TEST_RUNPOD_KEY", "--api-url", runpod.url)
    assert table.stdout.strip() == f"runpod $ORCH_TEST_RUNPOD_KEY @ {runpod.url}: no instances"

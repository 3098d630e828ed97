"""vast.ai against its stand-in (real HTTP, real sshd instances): the account's instances
listed from the v1 list (the v0 list the fallback), the credit, the refused key as vast says
it, and the states of an instance whose container dies while it starts."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from orchestrator.providers.api import ProviderAuthError
from orchestrator.providers.vast import Vast
from tests.support.orch import Orch
from tests.support.standin.vast import VastStandin


def control(vast: VastStandin, action: str, **args: Any) -> dict[str, Any]:
    """A test-only call of the stand-in (``/standin/ACTION``)."""
    req = urllib.request.Request(f"{vast.url}/standin/{action}", data=json.dumps(args).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=30) as answer:
        return json.loads(answer.read())


def test_instances_lists_every_instance_of_the_account_with_its_label_gpu_price_and_age(vast: VastStandin) -> None:
    made = control(vast, "console_create", label="forgotten in the console")["created"]
    adapter = Vast(vast.token, vast.url)
    calls = len(vast.calls)
    found = {i.id: i for i in adapter.instances()}
    assert vast.calls[calls:] == ["GET /api/v1/instances/"]
    mine = found[made]
    assert (mine.label, mine.gpu, mine.currency) == ("forgotten in the console", "1x RTX 4090", "USD")
    assert mine.state in ("creating", "starting", "running") and mine.price_per_hour is not None
    assert mine.created_at is not None
    adapter.release(made)
    assert made not in {i.id for i in adapter.instances()}
    assert made not in control(vast, "ledger")["billing"]


def test_the_credit_is_the_accounts_and_a_wrong_key_is_refused_as_vast_says_it(vast: VastStandin) -> None:
    balance = Vast(vast.token, vast.url).balance()
    assert balance is not None and (balance.amount, balance.currency) == (25.0, "USD")
    with pytest.raises(ProviderAuthError, match=r"vast instances: the token was refused \(HTTP 404\): Invalid user key"):
        Vast("wrong", vast.url).instances()


def rent(orch: Orch, vast: VastStandin, name: str, *extra: str, check: int = 0) -> tuple[Any, str]:
    """``orch rent NAME --provider vast`` against the stand-in, logging in as the new instance's
    user; the run and that user."""
    orch.env["ORCH_TEST_VAST_KEY"] = vast.token
    user = vast.next_user()
    done = orch("rent", name, "--provider", "vast", "--gpu", "RTX_4090", "--token-env", "ORCH_TEST_VAST_KEY",
                "--api-url", vast.url, "--python", "/usr/bin/python3", "--yes", "--user", user, "--root", "~/orch",
                *extra, check=check)
    return done, user


def instance_of(vast: VastStandin, user: str) -> str:
    (instance,) = [b for b in vast.boxes if vast.boxes[b].user == user]
    return instance


def test_direct_ssh_is_used_where_the_offer_has_open_ports_and_the_proxy_otherwise(
        orch: Orch, vast: VastStandin) -> None:
    direct, user = rent(orch, vast, "d1")  # offer 4101: open ports
    instance = instance_of(vast, user)
    assert f"SSH answers at {user}@127.0.0.1:{vast.boxes[instance].port}" in direct.stderr
    assert orch("exec", "d1", "--", "whoami").stdout.strip() == user
    assert control(vast, "ledger")["proxied"].get(instance, 0) == 0
    proxied, user2 = rent(orch, vast, "p1", "--min-reliability", "0.8", "--disk", "100")  # offer 4102: none
    instance2 = instance_of(vast, user2)
    proxy = vast.proxies[instance2].port
    assert proxy != vast.boxes[instance2].port and f"SSH answers at {user2}@127.0.0.1:{proxy}" in proxied.stderr
    assert orch("exec", "p1", "--", "whoami").stdout.strip() == user2
    assert control(vast, "ledger")["proxied"][instance2] >= 2
    for name in ("d1", "p1"):
        orch("release", name, "--yes")
    assert not {instance, instance2} & set(vast.billing())


def test_an_instance_that_exits_while_starting_fails_up_with_vasts_message_and_release_ends_its_billing(
        orch: Orch, vast: VastStandin) -> None:
    _, user = rent(orch, vast, "x1")
    instance = instance_of(vast, user)
    orch("down", "x1")
    control(vast, "exit_on_start", status_msg="Error response from daemon: OCI runtime create failed")
    failed = orch("up", "x1", env={"ORCH_UP_TIMEOUT_S": "300"}, check=4)
    assert (f"error: vast up: x1: instance {instance} failed while starting (exited: Error response from daemon: "
            "OCI runtime create failed)") in failed.stderr
    assert "`orch release x1` gives it back" in failed.stderr and "`orch up x1` tries again" in failed.stderr
    assert "SSH did not answer" not in failed.stderr and instance in vast.billing()
    orch("release", "x1", "--yes")
    assert instance not in vast.billing()


def test_a_wrong_vast_key_exits_3_with_vasts_words(orch: Orch, vast: VastStandin) -> None:
    orch.env["ORCH_TEST_VAST_KEY"] = "not-the-key"
    refused = orch("rent", "w1", "--provider", "vast", "--gpu", "RTX_4090", "--token-env", "ORCH_TEST_VAST_KEY",
                   "--api-url", vast.url, "--yes", check=3)
    assert "error: vast search: the token was refused (HTTP 404): Invalid user key" in refused.stderr
    assert "not-the-key" not in refused.stderr and not (orch.home / "hosts" / "w1.json").exists()


def test_the_stand_in_refuses_what_orch_must_not_send(vast: VastStandin) -> None:
    """A create field outside the official client's body, a method a path does not take, and a
    request without the key are refused, so a test fails when orch sends one."""
    def call(method: str, path: str, body: dict[str, Any] | None, key: str | None) -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(vast.url + path, method=method, data=None if body is None else
                                     json.dumps(body).encode(), headers={"Authorization": f"Bearer {key}"} if key
                                     else {})
        try:
            with urllib.request.urlopen(req, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    status, body = call("PUT", "/api/v0/asks/4105/", {"client_id": "me", "image": "x", "disk": 10,
                                                      "gpu_count": 1}, vast.token)
    assert (status, body["msg"]) == (400, "unknown fields: gpu_count")
    assert call("POST", "/api/v0/instances/81000001/", {}, vast.token)[0] == 405
    assert call("GET", "/api/v0/users/current/", None, None) == (404, {"success": False, "error": "auth_error",
                                                                       "msg": "Invalid user key"})

"""The AutoDL adapter and the HTTP client against a local HTTP server that answers what a test
says (real HTTP; no sshd): hostile or odd answers are errors naming the provider and the call,
never guesses; out-of-stock power-on is retried a bounded number of times, each wait said."""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest

from orchestrator.providers.api import (OutOfStock, ProviderAuthError, ProviderError, ProviderUnreachable,
                                        power_on_retrying)
from orchestrator.providers.autodl import AutoDL
from tests.support.orch import dead_port

Answer = Callable[[str, str, dict[str, str]], tuple[int, bytes]]


def envelope(data: Any, code: str = "Success", msg: str = "") -> Answer:
    return lambda method, path, headers: (200, json.dumps({"code": code, "msg": msg, "data": data}).encode())


def test_the_token_goes_in_the_authorization_header_and_the_snapshot_gives_the_endpoint(api: dict[str, Any]) -> None:
    api["answer"] = envelope({"proxy_host": "connect.example.com", "ssh_port": 40022, "root_password": "pw",
                              "ssh_command": "ssh -p 40022 root@connect.example.com", "payg_price": 1980})
    end = AutoDL("the-token", api["url"]).endpoint("inst-1")
    assert (end.address, end.port, end.user, end.password) == ("connect.example.com", 40022, "root", "pw")
    assert "pw" not in repr(end)
    method, path, headers, _ = api["seen"][-1]
    assert (method, path) == ("GET", "/api/v1/dev/instance/pro/snapshot?instance_uuid=inst-1")
    assert headers["Authorization"] == "the-token" and "the-token" not in path


@pytest.mark.parametrize("snapshot", [
    {"proxy_host": "a b", "ssh_port": 22, "root_password": "pw"},
    {"proxy_host": "h", "ssh_port": 70000, "root_password": "pw"},
    {"proxy_host": "h", "ssh_port": "22", "root_password": "pw"},
    {"proxy_host": "h", "ssh_port": 22, "root_password": ""},
    {"proxy_host": "h;rm -rf /", "ssh_port": 22, "root_password": "pw"},
])
def test_an_incomplete_or_hostile_snapshot_is_an_error_never_a_guess(api: dict[str, Any],
                                                                     snapshot: dict[str, Any]) -> None:
    api["answer"] = envelope(snapshot)
    with pytest.raises(ProviderError, match="autodl snapshot: no complete SSH endpoint"):
        AutoDL("t", api["url"]).endpoint("i")


@pytest.mark.parametrize(("answer", "kind", "words"), [
    (lambda m, p, h: (401, b'{"code": "Unauthorized", "msg": "token expired"}'), ProviderAuthError,
     "autodl status: the token was refused (HTTP 401): token expired"),
    (envelope(None, "AuthFailed", "invalid token"), ProviderAuthError, "autodl status: invalid token"),
    (envelope(None, "NotFound", "instance not found"), ProviderError, "autodl status: instance not found"),
    (lambda m, p, h: (200, b"<html>gateway</html>"), ProviderError, "autodl status: answer is not JSON"),
    (lambda m, p, h: (200, b'["no envelope"]'), ProviderError, "not AutoDL's {code, msg, data} envelope"),
    (lambda m, p, h: (502, b"bad gateway"), ProviderError, "autodl status: HTTP 502: bad gateway"),
])
def test_errors_name_the_provider_the_call_and_its_words(api: dict[str, Any], answer: Answer,
                                                         kind: type, words: str) -> None:
    api["answer"] = answer
    with pytest.raises(kind) as caught:
        AutoDL("t", api["url"]).state("i")
    assert words in str(caught.value)
    assert caught.value.exit_code == (3 if kind is ProviderAuthError else 4)


def test_an_unreachable_api_is_exit_3_and_a_slow_one_times_out(api: dict[str, Any],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ProviderUnreachable) as caught:
        AutoDL("t", f"http://127.0.0.1:{dead_port()}").state("i")
    assert caught.value.exit_code == 3 and "autodl status: cannot reach" in str(caught.value)
    import time

    def slow(method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        time.sleep(2)
        return 200, b"{}"
    api["answer"] = slow
    monkeypatch.setenv("ORCH_PROVIDER_TIMEOUT_S", "0.5")
    with pytest.raises(ProviderUnreachable, match="timed out"):
        AutoDL("t", api["url"]).state("i")


def test_state_price_and_release_date_come_from_list_status_and_snapshot(api: dict[str, Any]) -> None:
    def answer(method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        if path.endswith("/list"):
            data: Any = {"list": [{"uuid": "x", "status": "running"},
                                  {"uuid": "i", "status": "shutdown",
                                   "stopped_at": {"Time": "2026-11-20T10:00:00+08:00", "Valid": True}}],
                         "max_page": 1}
        else:
            data = {"payg_price": 1980}
        return 200, json.dumps({"code": "Success", "msg": "", "data": data}).encode()
    api["answer"] = answer
    found = AutoDL("t", api["url"]).instance("i")
    assert (found.state, found.status, found.price_per_hour, found.currency) == ("off", "shutdown", 1.98, "CNY")
    assert found.release_at is not None and found.release_at.isoformat() == "2026-12-05T10:00:00+08:00"


def test_out_of_stock_power_on_is_retried_a_bounded_number_of_times_each_wait_said(
        api: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    api["answer"] = envelope(None, "NoStock", "GPU 库存不足")
    monkeypatch.setenv("ORCH_STOCK_TRIES", "4")
    monkeypatch.setenv("ORCH_STOCK_DELAY_S", "100")
    said: list[str] = []
    waited: list[float] = []
    before = len(api["seen"])
    with pytest.raises(OutOfStock) as caught:
        power_on_retrying(AutoDL("t", api["url"]), "i", said.append, sleep=waited.append)
    assert waited == [100, 200, 300] and len(api["seen"]) - before == 4
    assert len(said) == 3 and "trying again in 100 s (1/4)" in said[0]
    assert "autodl power_on: GPU 库存不足 (tried 4 times over 600 s" in str(caught.value)
    body = json.loads(api["seen"][-1][3])
    assert body == {"instance_uuid": "i", "payload": "gpu"}

"""The AutoDL adapter and the HTTP client against a local HTTP server that answers what a test
says (real HTTP; no sshd): hostile or odd answers are errors naming the provider and the call,
never guesses; out-of-stock power-on is retried a bounded number of times, each wait said."""

from __future__ import annotations

import json
from typing import Any, Callable

import pytest

from orchestrator.errors import UsageError
from orchestrator.providers.api import (Balance, CreateUncertain, OutOfStock, ProviderAuthError, ProviderError,
                                        ProviderUnreachable, power_on_retrying)
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


def routed(answers: dict[str, Any]) -> Answer:
    """Envelopes by the path's last words (``list``, ``snapshot``, ``wallet/balance``), each
    with a request id as AutoDL sends one."""
    def answer(method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        key = next(k for k in answers if path.split("?")[0].endswith("/" + k))
        return 200, json.dumps({"code": "Success", "msg": "", "data": answers[key], "request_id": "rid-1"}).encode()
    return answer


@pytest.mark.parametrize(("rid", "shown"), [("0f1e2d3c-aa", " (request_id 0f1e2d3c-aa)"), ("has spaces; x", ""),
                                            ("r" * 500, ""), (None, "")])
def test_an_error_names_autodls_request_id_when_it_is_one(api: dict[str, Any], rid: object, shown: str) -> None:
    api["answer"] = lambda m, p, h: (200, json.dumps({"code": "InstanceNotFound", "msg": "实例不存在", "data": None,
                                                      "request_id": rid}).encode())
    with pytest.raises(ProviderError) as caught:
        AutoDL("t", api["url"]).power_off("i")
    assert str(caught.value) == "autodl power_off: 实例不存在" + shown


def test_a_refused_token_names_the_request_id_of_autodls_http_error_body(api: dict[str, Any]) -> None:
    api["answer"] = lambda m, p, h: (401, json.dumps({"code": "AuthorizeFailed", "msg": "token 已失效", "data": None,
                                                      "request_id": "9b2c-11"}).encode())
    with pytest.raises(ProviderAuthError) as caught:
        AutoDL("t", api["url"]).balance()
    assert str(caught.value) == "autodl balance: the token was refused (HTTP 401): token 已失效 (request_id 9b2c-11)"
    api["answer"] = lambda m, p, h: (401, json.dumps({"msg": "no", "request_id": "有 spaces"}).encode())
    with pytest.raises(ProviderAuthError) as caught:
        AutoDL("t", api["url"]).balance()
    assert str(caught.value).endswith("(HTTP 401): no")


@pytest.mark.parametrize(("status", "state"), [("removing", "released"), ("removed", "released"),
                                               ("releasing", "released"), ("creating", "creating"),
                                               ("shutting_down", "stopping"), ("something_new", "unknown")])
def test_every_status_maps_to_orchs_word_and_an_unknown_one_stays_unknown(api: dict[str, Any], status: str,
                                                                         state: str) -> None:
    api["answer"] = envelope(status)
    assert AutoDL("t", api["url"]).state("i") == (state, status)


def test_the_wallets_assets_are_milliyuan_and_come_back_in_cny(api: dict[str, Any]) -> None:
    api["answer"] = routed({"wallet/balance": {"assets": 12340, "accumulate": 987650, "voucher_balance": 5000}})
    assert AutoDL("t", api["url"]).balance() == Balance(amount=12.34, currency="CNY")
    method, path, _, body = api["seen"][-1]
    assert (method, path, json.loads(body)) == ("POST", "/api/v1/dev/wallet/balance", {})
    api["answer"] = routed({"wallet/balance": {"assets": "lots"}})
    with pytest.raises(ProviderError, match=r"autodl balance: answer holds no wallet assets \(request_id rid-1\)"):
        AutoDL("t", api["url"]).balance()


def test_instances_lists_every_instance_but_the_released_with_label_gpu_age_and_the_price_of_the_billing_ones(
        api: dict[str, Any]) -> None:
    rows = [{"uuid": "pro-a", "status": "running", "name": "orch-g1", "gpu_spec_uuid": "pro6000-p",
             "req_gpu_amount": 1, "created_at": "2026-12-01T10:00:00+08:00"},
            {"uuid": "pro-b", "status": "shutdown", "name": "", "gpu_spec_uuid": "unknown-spec", "req_gpu_amount": 2,
             "stopped_at": {"Time": "2026-12-01T10:00:00+08:00", "Valid": True}},
            {"uuid": "pro-c", "status": "released"}, {"uuid": "pro-d", "status": "removed"}, "not a row"]
    api["answer"] = routed({"list": {"list": rows, "max_page": 1}, "snapshot": {"payg_price": 5980}})
    before = len(api["seen"])
    found = AutoDL("t", api["url"]).instances()
    assert [(i.id, i.state, i.price_per_hour, i.label, i.gpu) for i in found] == [
        ("pro-a", "running", 5.98, "orch-g1", "1x PRO6000-96G"), ("pro-b", "off", None, "", "2x unknown-spec")]
    assert found[0].created_at is not None and found[0].created_at.isoformat() == "2026-12-01T10:00:00+08:00"
    assert found[1].release_at is not None and found[1].currency == "CNY"
    assert [p.split("?")[0].rsplit("/", 1)[1] for _, p, _, _ in api["seen"][before:]] == ["list", "snapshot"]


def test_an_order_turns_words_into_autodls_uuids_and_refuses_what_does_not_exist(api: dict[str, Any]) -> None:
    adl = AutoDL("t", api["url"])
    order = adl.order("RTX PRO 6000", 2, "cuda11.3-cudnn8-devel-ubuntu20.04-py38-torch1.11.0", "北京B区,westDC3", 50)
    assert (order.spec.uuid, order.count, order.image, order.cuda, order.regions, order.disk_gb) == \
        ("pro6000-p", 2, "base-image-l374uiucui", 113, ("beijingDC2", "westDC3"), 50)
    assert adl.order("rtx_4090", 1, "base-image-l2t43iu6uk", None, 0).spec.uuid == "v-48g"
    assert adl.order("4090d", 1, "base-image-l2t43iu6uk", None, 0).spec.uuid == "4090D"
    for args, words in [(("H100", 1, "base-image-l2t43iu6uk", None, 0), "no AutoDL Pro GPU 'H100'"),
                        (("4090D", 5, "base-image-l2t43iu6uk", None, 0), "1 to 4 GPUs"),
                        (("4090D", 1, "base-image-l2t43iu6uk", None, 501), "0 to 500 GB"),
                        (("4090D", 1, "base-image-l2t43iu6uk", "mars", 0), "no AutoDL region 'mars'")]:
        with pytest.raises(UsageError, match=words):
            adl.order(*args)
    api["answer"] = routed({"image/private/list": {"list": [{"image_uuid": "image-1", "name": "mine"},
                                                            {"image_uuid": "bad uuid", "name": "x"}], "max_page": 1}})
    assert (adl.order("5090", 1, "mine", None, 0).image, adl.order("5090", 1, "image-1", None, 0).cuda) == \
        ("image-1", 118)
    with pytest.raises(UsageError, match=r"no AutoDL image 'x'.*one of your own images: image-1 \(mine\)"):
        adl.order("5090", 1, "x", None, 0)


@pytest.mark.parametrize("data", ["pro-76419909953e", {"instance_uuid": "pro-76419909953e"}])
def test_create_sends_the_documented_fields_once_and_returns_the_uuid_in_data(api: dict[str, Any],
                                                                             data: object) -> None:
    adl = AutoDL("t", api["url"])
    order = adl.order("4090D", 1, "base-image-l2t43iu6uk", "westDC3", 0)
    api["answer"] = envelope(data)
    before = len(api["seen"])
    assert adl.create_order(order, "orch-g1") == "pro-76419909953e"
    ((method, path, _, body),) = api["seen"][before:]
    assert (method, path) == ("POST", "/api/v1/dev/instance/pro/create")
    assert json.loads(body) == {"req_gpu_amount": 1, "expand_system_disk_by_gb": 0, "gpu_spec_uuid": "4090D",
                                "image_uuid": "base-image-l2t43iu6uk", "cuda_v_from": 118,
                                "instance_name": "orch-g1", "data_center_list": ["westDC3"]}
    api["answer"] = envelope({"no": "uuid"})
    with pytest.raises(ProviderError, match="answer holds no instance uuid; an instance may have been created"):
        adl.create_order(order, "orch-g1")
    api["answer"] = lambda m, p, h: (503, b'{"code": "InternalError", "msg": "busy", "request_id": "r-9"}')
    with pytest.raises(CreateUncertain, match="may or may not have rented an instance"):
        adl.create_order(order, "orch-g1")

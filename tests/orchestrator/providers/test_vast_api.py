"""The vast.ai adapter against a local HTTP server that answers what a test says (real HTTP; no
sshd): every documented ``actual_status`` read with ``intended_status``, the account's instances
from the paged v1 list (the v0 list where v1 is not served, one instance through v1 where its v0
path is retired), a 404 that refuses the key as exit 3 and one that does not as exit 4, and
odd answers refused."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import pytest

from orchestrator.providers.api import ProviderAuthError, ProviderError, Wanted
from orchestrator.providers.vast import Vast


def reply(status: int, body: Any) -> tuple[int, bytes]:
    return status, json.dumps(body).encode()


# docs.vast.ai/sdk/python/reference/show-instance: actual_status null, loading, running,
# stopped, frozen, exited, rebooting, unknown, offline (and created, seen before loading).
@pytest.mark.parametrize(("actual", "intended", "msg", "state", "status"), [
    (None, "running", None, "creating", "provisioning"), ("created", "running", None, "creating", "created"),
    ("loading", "running", None, "starting", "loading"), ("running", "running", None, "running", "running"),
    ("running", "stopped", None, "stopping", "running"), ("stopped", "stopped", None, "off", "stopped"),
    ("stopped", "running", None, "starting", "stopped"), ("frozen", "frozen", None, "off", "frozen"),
    ("exited", "running", "OCI runtime create failed", "failed", "exited: OCI runtime create failed"),
    ("exited", "stopped", None, "off", "exited"), ("rebooting", "running", None, "starting", "rebooting"),
    ("unknown", "running", None, "unknown", "unknown"), ("offline", "running", None, "failed", "offline"),
    ("offline", "stopped", None, "off", "offline"), ("\x1b[2Jodd", "running", None, "unknown", "[2Jodd"),
])
def test_every_documented_status_is_read_with_what_was_asked(api: dict[str, Any], actual: str | None,
                                                              intended: str, msg: str | None, state: str,
                                                              status: str) -> None:
    api["answer"] = lambda method, path, headers: reply(200, {"instances": {
        "id": 5, "actual_status": actual, "intended_status": intended, "status_msg": msg}})
    assert Vast("k", api["url"]).state("5") == (state, status)


def test_instances_follows_next_token_through_the_v1_list(api: dict[str, Any]) -> None:
    pages = {None: ([{"id": 1, "actual_status": "running", "intended_status": "running", "dph_total": 0.41,
                      "label": "orch-g1", "gpu_name": "RTX 4090", "num_gpus": 2, "start_date": 1764900000.0}], "t1"),
             "t1": ([{"id": 2, "actual_status": "frozen", "intended_status": "frozen", "label": None},
                     {"id": "3"}, "junk"], None)}

    def answer(method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        url = urllib.parse.urlsplit(path)
        args = dict(urllib.parse.parse_qsl(url.query))
        assert (method, url.path) == ("GET", "/api/v1/instances/") and headers["Authorization"] == "Bearer k"
        assert json.loads(args["select_filters"]) == {} and json.loads(args["limit"]) == 25
        rows, token = pages[args.get("after_token")]
        return reply(200, {"instances": rows, "next_token": token, "total_instances": 3})

    api["answer"] = answer
    first, second = Vast("k", api["url"]).instances()
    assert (first.id, first.state, first.price_per_hour, first.label, first.gpu) == ("1", "running", 0.41,
                                                                                    "orch-g1", "2x RTX 4090")
    assert first.created_at is not None and first.created_at.year == 2025
    assert (second.id, second.state, second.status, second.label, second.created_at) == ("2", "off", "frozen",
                                                                                         "", None)
    assert first.bills and second.bills  # frozen: off to orch, "GPU charges apply" to vast


def test_the_v0_list_answers_where_v1_is_not_served_and_one_instance_comes_through_v1_where_v0_is_gone(
        api: dict[str, Any]) -> None:
    def answer(method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        url = urllib.parse.urlsplit(path)
        filters = json.loads(dict(urllib.parse.parse_qsl(url.query)).get("select_filters", "{}"))
        if url.path == "/api/v1/instances/" and not filters:
            return reply(404, {"success": False, "error": "not_found", "msg": "no such API"})
        if url.path == "/api/v0/instances/":
            return reply(200, {"instances": [{"id": 7, "actual_status": "running", "intended_status": "running"}]})
        if url.path == "/api/v0/instances/7/":
            return reply(410, {"success": False, "msg": "This endpoint has been retired."})
        assert filters == {"id": {"eq": 7}}
        return reply(200, {"instances": [{"id": 7, "actual_status": "loading", "intended_status": "running"}]})

    api["answer"] = answer
    vast = Vast("k", api["url"])
    assert [(i.id, i.state) for i in vast.instances()] == [("7", "running")]
    assert vast.state("7") == ("starting", "loading")
    assert urllib.parse.urlsplit(api["seen"][-1][1]).path == "/api/v1/instances/"


@pytest.mark.parametrize(("status", "body", "kind", "words"), [
    (404, {"success": False, "error": "auth_error", "msg": "Invalid user key"}, ProviderAuthError,
     "vast instances: the token was refused (HTTP 404): Invalid user key"),
    (404, {"success": False, "error": "auth_error"}, ProviderAuthError,
     "vast instances: the token was refused (HTTP 404): auth_error"),
    (404, {"msg": "Session expired. Please log in again."}, ProviderAuthError, "Session expired"),
    (401, {"success": False, "msg": "Invalid user key"}, ProviderAuthError,
     "vast instances: the token was refused (HTTP 401): Invalid user key"),
    (500, {"msg": "internal"}, ProviderError, "vast instances: HTTP 500: internal"),
    (200, {"instances": "all of them"}, ProviderError, "vast instances: answer has no instance list"),
    (200, {"instances": [], "next_token": ["x"]}, ProviderError, "odd next_token"),
])
def test_a_refused_key_is_exit_3_whatever_its_status_and_odd_answers_are_errors(
        api: dict[str, Any], status: int, body: Any, kind: type, words: str) -> None:
    api["answer"] = lambda method, path, headers: reply(status, body)
    with pytest.raises(kind) as caught:
        Vast("k", api["url"]).instances()
    assert type(caught.value) is kind and words in str(caught.value)
    assert caught.value.exit_code == (3 if kind is ProviderAuthError else 4)


def test_a_404_for_a_missing_instance_is_not_a_refused_key(api: dict[str, Any]) -> None:
    api["answer"] = lambda method, path, headers: reply(404, {"success": False, "error": "no_such_instance",
                                                              "msg": "Instance 5 not found."})
    with pytest.raises(ProviderError) as caught:
        Vast("k", api["url"]).power_off("5")
    assert type(caught.value) is ProviderError and "vast stop: HTTP 404: Instance 5 not found." in str(caught.value)


@pytest.mark.parametrize(("body", "amount"), [({"id": 1, "credit": 12.345}, 12.35), ({"credit": "12"}, None),
                                              ({"credit": True}, None), ([], None)])
def test_the_balance_is_the_credit_in_usd(api: dict[str, Any], body: Any, amount: float | None) -> None:
    api["answer"] = lambda method, path, headers: reply(200, body)
    if amount is None:
        with pytest.raises(ProviderError, match="vast balance: answer has no credit"):
            Vast("k", api["url"]).balance()
    else:
        found = Vast("k", api["url"]).balance()
        assert found is not None and (found.amount, found.currency) == (amount, "USD")
        assert api["seen"][-1][1] == "/api/v0/users/current/"


@pytest.mark.parametrize(("row", "endpoint"), [
    ({"public_ipaddr": "203.0.113.7", "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41022"}]},
      "ssh_host": "ssh4.vast.ai", "ssh_port": 10022}, ("203.0.113.7", 41022)),
    ({"public_ipaddr": "203.0.113.7", "ports": {}, "ssh_host": "ssh4.vast.ai", "ssh_port": 10022},
     ("ssh4.vast.ai", 10022)),
    ({"public_ipaddr": None, "ports": {"22/tcp": [{"HostPort": "41022"}]}, "ssh_host": "ssh4.vast.ai",
      "ssh_port": 10022}, ("ssh4.vast.ai", 10022)),
    ({"public_ipaddr": "203.0.113.7", "ports": {"22/tcp": "41022"}, "ssh_host": "ssh4.vast.ai", "ssh_port": 10022},
     ("ssh4.vast.ai", 10022)),
])
def test_direct_ssh_where_the_instance_maps_its_port_22_and_the_proxy_otherwise(
        api: dict[str, Any], row: dict[str, Any], endpoint: tuple[str, int]) -> None:
    api["answer"] = lambda method, path, headers: reply(200, {"instances": {
        "id": 5, "actual_status": "running", "intended_status": "running", **row}})
    end = Vast("k", api["url"]).endpoint("5")
    assert (end.address, end.port) == endpoint


def test_one_instance_carries_its_label_gpus_and_start_like_the_list(api: dict[str, Any]) -> None:
    api["answer"] = lambda method, path, headers: reply(200, {"instances": {
        "id": 5, "actual_status": "running", "intended_status": "running", "dph_total": 0.5, "label": "orch-g1\n",
        "gpu_name": "RTX 4090", "num_gpus": 1, "start_date": "yesterday"}})
    found = Vast("k", api["url"]).instance("5")
    assert (found.id, found.state, found.price_per_hour, found.label, found.gpu, found.created_at) == (
        "5", "running", 0.5, "orch-g1", "1x RTX 4090", None)


# An interruptible instance (``is_bid``) outbid is paused until its bid wins again: stopped while
# meant to run (docs.vast.ai instance-details); the same row on demand is a start that waits.
@pytest.mark.parametrize(("row", "state", "status"), [
    ({"is_bid": True, "actual_status": "stopped", "intended_status": "running"}, "preempted", "stopped: outbid"),
    ({"is_bid": True, "actual_status": None, "cur_state": "stopped", "intended_status": "running"},
     "preempted", "stopped: outbid"),
    ({"is_bid": True, "actual_status": "stopped", "intended_status": "stopped"}, "off", "stopped"),
    ({"is_bid": True, "actual_status": "running", "intended_status": "running"}, "running", "running"),
    ({"is_bid": False, "actual_status": "stopped", "intended_status": "running"}, "starting", "stopped"),
])
def test_an_outbid_interruptible_instance_is_preempted(api: dict[str, Any], row: dict[str, Any], state: str,
                                                       status: str) -> None:
    api["answer"] = lambda method, path, headers: reply(200, {"instances": {"id": 5, **row}})
    found = Vast("k", api["url"]).instance("5")
    assert (found.state, found.status, found.preempted, found.interruptible) == (
        state, status, state == "preempted", row["is_bid"])
    assert found.bills == (state not in ("preempted", "off"))


def test_a_bid_search_places_the_least_bid_and_change_bid_sends_the_price(api: dict[str, Any]) -> None:
    def answer(method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        return reply(200, {"offers": [
            {"id": 1, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.4, "min_bid": 0.2, "reliability": 0.99},
            {"id": 2, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.3, "min_bid": None, "reliability": 0.99},
            {"id": 3, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.5, "min_bid": 0.35, "reliability": 0.99}]}
            if path.endswith("/bundles/") else {"success": True})
    api["answer"] = answer
    vast = Vast("k", api["url"])
    found = vast.search(Wanted(gpu="RTX_4090", interruptible=True, bid=0.3))
    assert [(o.id, o.price_per_hour, o.bid, o.on_demand_per_hour) for o in found] == [("1", 0.3, 0.3, 0.4)]
    assert "bid 0.3 USD/h (interruptible; on demand 0.4 USD/h)" in found[0].describe()
    least = vast.search(Wanted(gpu="RTX_4090", interruptible=True))
    assert [(o.id, o.bid) for o in least] == [("1", 0.2), ("3", 0.35)]
    assert Wanted(gpu="x", bid=0.2).problem() == "a bid is for an interruptible instance: add --interruptible"
    searched = json.loads(api["seen"][-1][3])
    assert searched["type"] == "bid" and "min_bid" not in searched and "dph_total" not in searched
    assert json.loads(api["seen"][-2][3])["min_bid"] == {"lte": 0.3}
    vast.change_bid("5", 0.5)
    assert api["seen"][-1][:2] == ("PUT", "/api/v0/instances/bid_price/5/")
    assert json.loads(api["seen"][-1][3]) == {"client_id": "me", "price": 0.5}
    with pytest.raises(ProviderError, match="a bid is 0.001 to 32 USD/h"):
        vast.change_bid("5", 40)

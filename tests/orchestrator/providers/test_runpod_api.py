"""The RunPod adapter (REST v2) against a local HTTP server that answers what a test says (real
HTTP; no sshd) and against the RunPod stand-in (real HTTP, real sshd pods): the key in a Bearer
header only, the catalog read per cloud, every documented status mapped, the SSH endpoint from
``ssh.direct`` and never the proxy, a create body RunPod's schema accepts, a create that failed
ambiguously looked up by name, the account's pods and balance, RunPod's own words in errors."""

from __future__ import annotations

import json
import secrets
import shutil
import tempfile
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from orchestrator.providers.api import (CreateUncertain, Offer, OutOfStock, ProviderAuthError, ProviderError,
                                        Wanted)
from orchestrator.providers.runpod import RunPod
from tests.support.standin.runpod import RunPodStandin
from tests.support.tiers import needs

Answer = Callable[[str, str, dict[str, str]], tuple[int, bytes]]


def answer(body: Any, status: int = 200) -> Answer:
    raw = b"" if body is None else json.dumps(body).encode()
    return lambda method, path, headers: (status, raw)


def by_path(routes: dict[str, tuple[int, Any]]) -> Answer:
    """The answer for the first route whose ``METHOD /path`` prefix the request starts with."""
    def reply(method: str, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
        for start, (status, body) in routes.items():
            if f"{method} {path}".startswith(start):
                return status, b"" if body is None else json.dumps(body).encode()
        return 404, json.dumps({"title": "Not Found", "status": 404, "detail": "resource not found"}).encode()
    return reply


def gpu_row(gpu_id: str, name: str, secure: Any, community: Any, availability: str = "HIGH", **extra: Any) -> dict:
    return {"id": gpu_id, "name": name, "memory": 24, "secure": secure is not None, "community": community is not None,
            "price": {"secure": secure or 0, "community": community or 0}, "maxCount": {"secure": 8, "community": 2},
            "availability": availability, **extra}


CATALOG = {"gpus": [
    gpu_row("NVIDIA GeForce RTX 4090", "RTX 4090", 0.69, "0.34"),  # a price as a numeric string
    gpu_row("NVIDIA GeForce RTX 4090 D", "RTX 4090 D", 0.2, None, availability="NONE"),
    gpu_row("NVIDIA A100 80GB PCIe", "A100 PCIe", 1.64, None),
    gpu_row("bad\nname", "RTX 4090", 0.01, 0.01),
    gpu_row("NVIDIA GeForce RTX 4090 X", "RTX 4090 X", "cheap", "1e-9"),  # prices that are no numbers
    "not a row",
]}


def test_search_reads_the_catalog_once_per_cloud_with_stock_count_and_per_gpu_prices(api: dict[str, Any]) -> None:
    api["answer"] = answer(CATALOG)
    before = len(api["seen"])
    offers = RunPod("k", api["url"]).search(Wanted(gpu="rtx-4090", count=2))
    assert [(o.id, o.price_per_hour, o.where) for o in offers] == [
        ("NVIDIA GeForce RTX 4090 (community)", 0.68, "community cloud, stock high"),
        ("NVIDIA GeForce RTX 4090 (secure)", 1.38, "secure cloud, stock high")]
    assert offers[0].ref == (("gpu_type", "NVIDIA GeForce RTX 4090"), ("cloud", "COMMUNITY"))
    asked = [(m, p, h["Authorization"]) for m, p, h, _ in api["seen"][before:]]
    assert asked == [("GET", "/v2/catalog/gpus?include=AVAILABILITY&product=POD&count=2&cloud=SECURE", "Bearer k"),
                     ("GET", "/v2/catalog/gpus?include=AVAILABILITY&product=POD&count=2&cloud=COMMUNITY", "Bearer k")]
    before = len(api["seen"])
    secure = RunPod("k", api["url"]).search(Wanted(gpu="RTX 4090", min_reliability=0.99, max_price=1.0))
    assert [o.price_per_hour for o in secure] == [0.69] and len(api["seen"]) - before == 1
    assert RunPod("k", api["url"]).search(Wanted(gpu="RTX 4090", max_price=0.3)) == []
    assert RunPod("k", api["url"]).search(Wanted(gpu="RTX 4090", count=4, min_reliability=0.99))[0].count == 4
    assert [o.id for o in RunPod("k", api["url"]).search(Wanted(gpu="RTX 4090", count=4))] == [
        "NVIDIA GeForce RTX 4090 (secure)"]  # the community cloud's largest machine has 2


def test_a_catalog_without_a_gpus_list_or_a_refused_key_carry_runpods_words(api: dict[str, Any]) -> None:
    api["answer"] = answer({"items": []})
    with pytest.raises(ProviderError, match="runpod search: answer has no gpus list"):
        RunPod("k", api["url"]).search(Wanted(gpu="A100"))
    api["answer"] = answer({"title": "Unauthorized", "status": 401, "detail": "invalid bearer token"}, status=401)
    with pytest.raises(ProviderAuthError, match=r"runpod pod: the token was refused \(HTTP 401\): invalid bearer"):
        RunPod("k", api["url"]).state("p1")


OFFER = Offer(provider="runpod", id="x", gpu="RTX 4090", count=2, price_per_hour=0.68,
              ref=(("gpu_type", "NVIDIA GeForce RTX 4090"), ("cloud", "COMMUNITY")))


def test_create_sends_the_v2_body_with_ssh_published_and_the_key_once(api: dict[str, Any]) -> None:
    api["answer"] = answer({"id": "pod123", "status": "PROVISIONING"}, status=201)
    assert RunPod("k", api["url"]).create(OFFER, "runpod/pytorch", 50, "orch-g", "ssh-ed25519 AAAA x") == "pod123"
    method, path, _, body = api["seen"][-1]
    assert (method, path) == ("POST", "/v2/pods")
    assert json.loads(body) == {"name": "orch-g", "image": "runpod/pytorch", "cloud": "COMMUNITY",
                                "gpu": {"id": "NVIDIA GeForce RTX 4090", "count": 2}, "disk": 20,
                                "mounts": {"persistent": {"size": 50, "path": "/workspace"}},
                                "ports": ["22/tcp"], "env": {"PUBLIC_KEY": "ssh-ed25519 AAAA x"}}
    api["answer"] = answer({"title": "Unprocessable Entity", "status": 422, "detail": "Request validation failed.",
                            "errors": ["$: additional properties 'bogus' not allowed"]}, status=422)
    before = len(api["seen"])
    with pytest.raises(ProviderError) as refused:
        RunPod("k", api["url"]).create(OFFER, "img", 50, "orch-g", "ssh-ed25519 AAAA x")
    assert type(refused.value) is ProviderError and len(api["seen"]) - before == 1
    assert str(refused.value) == ("runpod create: HTTP 422: Request validation failed. "
                                  "($: additional properties 'bogus' not allowed)")


def pod(pod_id: str, name: str, created: str, status: str = "PROVISIONING", **extra: Any) -> dict[str, Any]:
    return {"id": pod_id, "name": name, "status": status, "createdAt": created, "cost": 0.68,
            "gpu": {"id": "NVIDIA GeForce RTX 4090", "count": 2}, **extra}


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize(("pods", "outcome"), [
    ([pod("made1", "orch-g", now()), pod("other", "orch-h", now())], "made1"),
    ([pod("old1", "orch-g", "2026-01-01T00:00:00Z")], "no pod named orch-g is listed now"),
    ([], "no pod named orch-g is listed now"),
    ([pod("a1", "orch-g", now()), pod("a2", "orch-g", now())], "pods named orch-g: a1, a2"),
    ([pod("gone", "orch-g", now(), status="TERMINATED")], "no pod named orch-g is listed now"),
])
def test_a_create_that_answered_5xx_takes_the_pod_it_made_found_by_name_and_never_sends_twice(
        api: dict[str, Any], pods: list[dict[str, Any]], outcome: str) -> None:
    api["answer"] = by_path({"POST /v2/pods": (500, {"title": "Internal Server Error", "status": 500,
                                                     "detail": "upstream request failed"}),
                             "GET /v2/pods?includeClusterPods=true": (200, {"pods": pods})})
    before = len(api["seen"])
    if outcome.isalnum():
        assert RunPod("k", api["url"]).create(OFFER, "img", 50, "orch-g", "ssh-ed25519 AAAA x") == outcome
    else:
        with pytest.raises(CreateUncertain) as caught:
            RunPod("k", api["url"]).create(OFFER, "img", 50, "orch-g", "ssh-ed25519 AAAA x")
        assert "runpod create: HTTP 500: upstream request failed. The provider may or may not have rented" in str(
            caught.value) and outcome in str(caught.value) and "console.runpod.io/pods" in str(caught.value)
    assert [(m, p) for m, p, _, _ in api["seen"][before:]] == [("POST", "/v2/pods"),
                                                              ("GET", "/v2/pods?includeClusterPods=true")]


def test_a_create_whose_lookup_fails_too_says_both(api: dict[str, Any]) -> None:
    api["answer"] = by_path({"POST /v2/pods": (502, {"title": "Bad Gateway", "status": 502, "detail": "bad gateway"}),
                             "GET /v2/pods": (503, {"title": "Unavailable", "status": 503, "detail": "try later"})})
    with pytest.raises(CreateUncertain, match=r"HTTP 502: bad gateway\. .*\(looking for a pod named orch-g failed "
                                              r"too: HTTP 503: try later\)"):
        RunPod("k", api["url"]).create(OFFER, "img", 50, "orch-g", "ssh-ed25519 AAAA x")


DIRECT = {"ssh": {"proxy": {"host": "ssh.runpod.io", "port": 22, "username": "p1-64411eb2"},
                  "direct": {"host": "203.0.113.9", "port": 40123, "username": "root"}}}
ONLY_PROXY = {"ssh": {"proxy": {"host": "ssh.runpod.io", "port": 22, "username": "p1-64411eb2"}, "direct": None}}
RUNTIME = {"ssh": ONLY_PROXY["ssh"], "runtime": {"ports": [
    {"private": 8888, "public": 40000, "type": "http", "ip": "203.0.113.5"},
    {"private": 22, "public": 40222, "type": "tcp", "ip": "203.0.113.7"}]}}


@pytest.mark.parametrize(("fields", "state", "endpoint"), [
    ({"status": "RUNNING", "cost": 0.69, **DIRECT}, "running", ("203.0.113.9", 40123)),
    ({"status": "RUNNING", "cost": "0.69", **RUNTIME}, "running", ("203.0.113.7", 40222)),
    ({"status": "RUNNING", **ONLY_PROXY, "runtime": None}, "starting", None),  # the proxy carries no rsync
    ({"status": "RUNNING", "ssh": {"direct": {"host": "203.0.113.9 ; x", "port": 40123}}}, "running", None),
    ({"status": "RUNNING", "ssh": {"direct": {"host": "203.0.113.9", "port": 70000}}}, "running", None),
    ({"status": "PROVISIONING", **ONLY_PROXY}, "creating", None),
    ({"status": "STARTING"}, "starting", None),
    ({"status": "EXITED", "cost": 0.0}, "off", None),
    ({"status": "ERROR"}, "failed", None),
    ({"status": "TERMINATED"}, "released", None),
    ({"status": "SOMETHING NEW"}, "unknown", None),
])
def test_every_documented_status_is_mapped_and_ssh_is_direct_or_nothing(
        api: dict[str, Any], fields: dict[str, Any], state: str, endpoint: tuple[str, int] | None) -> None:
    api["answer"] = answer({"id": "p1", **fields})
    runpod = RunPod("k", api["url"])
    found = runpod.instance("p1")
    asked = [path for _, path, _, _ in api["seen"]]
    # an EXITED pod is also asked of GraphQL (a spot pod interrupted?), whose answer here is no GraphQL answer
    assert found.state == state and asked[-2 if state == "off" else -1] == "/v2/pods/p1"
    assert (asked[-1] == "/graphql") == (state == "off")
    assert found.price_per_hour == (0.69 if "cost" in fields and fields["cost"] else
                                    0.0 if "cost" in fields else None)
    if endpoint is None:
        with pytest.raises(ProviderError, match="runpod pod: no SSH endpoint yet"):
            runpod.endpoint("p1")
    else:
        end = runpod.endpoint("p1")
        assert (end.address, end.port, end.user, end.password) == (*endpoint, None, None)


def test_start_and_stop_are_one_action_a_start_without_gpus_is_out_of_stock_and_delete_releases(
        api: dict[str, Any]) -> None:
    api["answer"] = answer({"id": "p1", "status": "STARTING"})
    runpod = RunPod("k", api["url"])
    runpod.power_on("p1")
    runpod.power_off("p1")
    assert [(m, p, json.loads(b)) for m, p, _, b in api["seen"][-2:]] == [
        ("POST", "/v2/pods/p1/action", {"action": "start"}), ("POST", "/v2/pods/p1/action", {"action": "stop"})]
    api["answer"] = answer({"title": "Bad Request", "status": 400,
                            "detail": "There are not enough free GPUs on the host machine to start this pod."}, 400)
    with pytest.raises(OutOfStock, match="runpod start: HTTP 400: There are not enough free GPUs"):
        runpod.power_on("p1")
    api["answer"] = answer({"title": "Conflict", "status": 409, "detail": "action stop is not valid"}, 409)
    with pytest.raises(ProviderError, match="runpod stop: HTTP 409: action stop is not valid"):
        runpod.power_off("p1")
    api["answer"] = answer({"title": "Not Found", "status": 404, "detail": "pod not found"}, 404)
    assert runpod.instance("p/../x").state == "released" and api["seen"][-1][1] == "/v2/pods/p%2F..%2Fx"
    api["answer"] = answer(None, status=204)
    runpod.release("p1")
    assert api["seen"][-1][:2] == ("DELETE", "/v2/pods/p1")


def test_instances_lists_every_pod_with_name_gpu_price_and_age_but_deleted_ones(api: dict[str, Any]) -> None:
    api["answer"] = answer({"pods": [
        pod("p1", "orch-g", "2026-12-01T10:00:00Z", status="RUNNING", **DIRECT),
        pod("p2", "from-console", "not a time", status="EXITED", cost=0),
        pod("p3", "gone", "2026-12-01T10:00:00Z", status="TERMINATED"),
        {"id": "bad id!", "status": "RUNNING"}, "not a pod"]})
    found = RunPod("k", api["url"]).instances()
    assert [path for _, path, _, _ in api["seen"][-2:]] == ["/v2/pods?includeClusterPods=true", "/graphql"]
    assert [(i.id, i.state, i.status, i.label, i.gpu, i.price_per_hour, i.currency) for i in found] == [
        ("p1", "running", "RUNNING", "orch-g", "2x NVIDIA GeForce RTX 4090", 0.68, "USD"),
        ("p2", "off", "EXITED", "from-console", "2x NVIDIA GeForce RTX 4090", 0.0, "USD")]
    assert found[0].created_at == datetime(2026, 12, 1, 10, tzinfo=timezone.utc) and found[1].created_at is None


def test_balance_asks_graphql_for_the_client_balance_with_the_key_in_a_header(api: dict[str, Any]) -> None:
    api["answer"] = answer({"data": {"myself": {"clientBalance": "12.5"}}})
    balance = RunPod("k", api["url"]).balance()
    assert balance is not None and (balance.amount, balance.currency) == (12.5, "USD")
    method, path, headers, body = api["seen"][-1]
    assert (method, path, headers["Authorization"]) == ("POST", "/graphql", "Bearer k")
    assert "myself { clientBalance }" in json.loads(body)["query"] and "k" not in path
    api["answer"] = answer({"errors": [{"message": "Something went wrong"}]})
    with pytest.raises(ProviderError, match="runpod balance: Something went wrong"):
        RunPod("k", api["url"]).balance()


# Against the stand-in: what orch sends is what RunPod's schema accepts.

@pytest.fixture(scope="module")
@needs("root")
def runpod() -> Iterator[RunPodStandin]:
    """The RunPod stand-in for this module (its pods are real sshd processes)."""
    workdir = Path(tempfile.mkdtemp(prefix="orch-standin-"))
    workdir.chmod(0o755)
    standin = RunPodStandin(workdir, "tok-" + secrets.token_hex(12), boot_delay_s=0.3, user_prefix="orchsu")
    standin.start()
    yield standin
    standin.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def admin(standin: RunPodStandin, action: str, args: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(f"{standin.url}/standin/{action}", data=json.dumps(args).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=10) as reply:
        return json.loads(reply.read())


def test_the_stand_in_takes_orchs_create_lists_it_and_refuses_what_runpod_refuses(runpod: RunPodStandin) -> None:
    adapter = RunPod(runpod.token, runpod.url)
    (offer, *_) = adapter.search(Wanted(gpu="RTX 4090", min_reliability=0.99))
    pod_id = adapter.create(offer, "runpod/pytorch", 40, "orch-t1", "ssh-ed25519 AAAAC3Nza t@x")
    assert runpod.pods[pod_id]["mounts"] == {"persistent": {"size": 40, "path": "/workspace"}}
    listed = {i.id: i for i in adapter.instances()}
    assert listed[pod_id].label == "orch-t1" and listed[pod_id].gpu == "1x NVIDIA GeForce RTX 4090"
    assert listed[pod_id].price_per_hour == 0.69 and listed[pod_id].created_at is not None
    balance = adapter.balance()
    assert balance is not None and balance.amount == runpod.balance
    with pytest.raises(ProviderError, match=r"runpod create: HTTP 400: There are no longer any instances"):
        adapter.create(Offer(provider="runpod", id="h", gpu="H100", count=1, price_per_hour=2.69,
                             ref=(("gpu_type", "NVIDIA H100 80GB HBM3"), ("cloud", "SECURE"))),
                       "img", 40, "orch-t2", "ssh-ed25519 AAAAC3Nza t@x")
    with pytest.raises(ProviderError, match=r"HTTP 422: Request validation failed\. \(\$\.mounts\.persistent\.size"):
        adapter.create(offer, "img", 5, "orch-t3", "ssh-ed25519 AAAAC3Nza t@x")
    refused = adapter.rest.request  # a v1 field, sent by hand: RunPod v2 names it
    with pytest.raises(ProviderError, match=r"HTTP 422: .*additional properties 'imageName' not allowed"):
        refused("POST", "/pods", "create", body={"name": "x", "image": "i", "imageName": "i",
                                                 "gpu": {"id": "NVIDIA GeForce RTX 4090", "count": 1}})
    with pytest.raises(ProviderError, match=r"HTTP 422: .*\$\.action: value must be one of"):
        refused("POST", f"/pods/{pod_id}/action", "reset", body={"action": "reset"})
    adapter.release(pod_id)
    assert adapter.state(pod_id) == ("released", "deleted") and pod_id not in runpod.billing()
    with pytest.raises(ProviderAuthError, match=r"runpod list: the token was refused \(HTTP 401\): invalid bearer"):
        RunPod("not-the-token", runpod.url).instances()


def test_the_stand_ins_5xx_after_making_a_pod_is_found_by_name_and_released(runpod: RunPodStandin) -> None:
    adapter = RunPod(runpod.token, runpod.url)
    (offer, *_) = adapter.search(Wanted(gpu="RTX 4090"))
    admin(runpod, "create_fault", {"status": 500})
    before = len(runpod.calls)
    pod_id = adapter.create(offer, "runpod/pytorch", 40, "orch-t4", "ssh-ed25519 AAAAC3Nza t@x")
    assert runpod.calls[before:] == ["POST /v2/pods", "GET /v2/pods"]
    assert runpod.pods[pod_id]["name"] == "orch-t4" and pod_id in runpod.billing()
    adapter.release(pod_id)
    assert pod_id not in runpod.billing()


def test_a_spot_search_asks_graphql_for_the_least_bid_and_an_interrupted_spot_pod_is_preempted(
        api: dict[str, Any]) -> None:
    least = {"data": {"gpuTypes": [
        {"id": "NVIDIA GeForce RTX 4090", "lowestPrice": {"gpuTypeId": "NVIDIA GeForce RTX 4090",
                                                          "minimumBidPrice": 0.2, "uninterruptablePrice": 0.34}},
        {"id": "NVIDIA A100 80GB PCIe", "lowestPrice": {"gpuTypeId": "NVIDIA A100 80GB PCIe",
                                                        "minimumBidPrice": None, "uninterruptablePrice": 1.6}}]}}
    api["answer"] = by_path({
        "GET /v2/catalog/gpus": (200, {"gpus": [gpu_row("NVIDIA GeForce RTX 4090", "RTX 4090", 0.69, 0.34),
                                                gpu_row("NVIDIA A100 80GB PCIe", "A100 PCIe", 1.64, 1.2)]}),
        "POST /graphql": (200, least)})
    found = RunPod("k", api["url"]).search(Wanted(gpu="4090", count=2, interruptible=True))
    assert [(o.id, o.price_per_hour, o.on_demand_per_hour, dict(o.ref)["bid_per_gpu"]) for o in found] == [
        ("NVIDIA GeForce RTX 4090 (secure)", 0.4, 1.38, "0.2"), ("NVIDIA GeForce RTX 4090 (community)", 0.4, 0.68, "0.2")]
    asked = [a for a in (json.loads(b) for m, p, _, b in api["seen"] if p == "/graphql") if "lowestPrice" in a["query"]]
    assert [a["variables"]["input"] for a in asked] == [{"gpuCount": 2, "secureCloud": True},
                                                       {"gpuCount": 2, "secureCloud": False}]
    assert "lowestPrice(input: $input)" in asked[0]["query"] and "minimumBidPrice" in asked[0]["query"]

    exited = {"id": "p1", "status": "EXITED", "cost": 0}
    for spot, desired, state in (("INTERRUPTABLE", "RUNNING", "preempted"), ("INTERRUPTABLE", "EXITED", "off"),
                                 ("RESERVED", "RUNNING", "off")):
        api["answer"] = by_path({"GET /v2/pods/p1": (200, exited), "POST /graphql": (200, {"data": {"pod": {
            "id": "p1", "podType": spot, "desiredStatus": desired}}})})
        found_pod = RunPod("k", api["url"]).instance("p1")
        assert (found_pod.state, found_pod.preempted) == (state, state == "preempted")
        assert 'pod(input: {podId: "p1"}) { id podType desiredStatus }' in json.loads(api["seen"][-1][3])["query"]

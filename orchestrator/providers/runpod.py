"""RunPod through its REST API v2 (``api.runpod.io/v2``) and, for the account balance and spot
pods only, its GraphQL API (docs/providers.md cites the source of every call and field).

REST v1 (``rest.runpod.io/v1``) is retired (RunPod's "Migrate from API v1" guide); v2 has
everything orch needs but the balance: the catalog (``GET /catalog/gpus``: per-GPU prices and
stock, per cloud), pods (create, get, list, ``action`` start/stop, delete). The API key goes in
``Authorization: Bearer KEY`` on both (never in a URL). A pod is created with ``22/tcp``
published and orch's public key in its ``PUBLIC_KEY`` variable, which RunPod's images put in
``authorized_keys``; its SSH endpoint is ``ssh.direct`` (else the ``runtime.ports`` entry whose
``private`` port is 22), never ``ssh.proxy`` (an interactive shell only: no rsync). A stopped
pod keeps only its persistent mount (``/workspace``); its container disk is wiped, so orch's root
on a RunPod host is ``/workspace/orch``. Prices are USD per hour. ``--api-url URL`` serves both:
REST under ``URL/v2``, GraphQL at ``URL/graphql``.

Interruptible (spot) pods: REST v2 has none (no field of ``CreatePodRequest``, whose schema
refuses unknown ones, no spot price in the catalog), and v1's ``interruptible: true`` is retired
with v1; GraphQL still rents them: ``gpuTypes { lowestPrice(input: {gpuCount, secureCloud}) {
gpuTypeId minimumBidPrice uninterruptablePrice } }`` gives the least bid per GPU, the mutation
``podRentInterruptable(input: PodRentInterruptableInput)`` rents at ``bidPerGpu``. REST v2 reads
the pod as any other; a spot pod (GraphQL ``podType`` ``INTERRUPTABLE``) that REST reports
``EXITED`` while GraphQL's ``desiredStatus`` is not ``EXITED`` (nobody stopped it) was
interrupted: ``preempted``.
"""

from __future__ import annotations

import re
import time
import urllib.parse
from dataclasses import replace
from datetime import datetime
from typing import Any

from orchestrator.providers.api import (Balance, CreateUncertain, Instance, Marketplace, Offer, OutOfStock,
                                        ProviderAuthError, ProviderError, State, Wanted)
from orchestrator.providers.http import JsonClient

REST_URL = "https://api.runpod.io/v2"
GRAPHQL_URL = "https://api.runpod.io/graphql"
ROOT = "/workspace/orch"
CONTAINER_DISK_GB = 20
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_GPU_TYPE = re.compile(r"^[A-Za-z0-9 ._()-]{1,80}$")
_STOCK_WORDS = ("not enough free gpu", "no longer any instances available", "no instances available",
                "out of stock", "insufficient capacity")
CLOUDS = ("SECURE", "COMMUNITY")
# v2 PodStatus, every documented value (openapi.json components.schemas.PodStatus)
STATES: dict[str, State] = {"PROVISIONING": "creating", "STARTING": "starting", "RUNNING": "running",
                            "EXITED": "off", "ERROR": "failed", "TERMINATED": "released"}
# how far a pod's createdAt may lie before the create request and still be that request's pod
# (the two clocks differ); an older pod of the same name is someone else's
_CLOCK_SLACK_S = 600.0
BALANCE_QUERY = "query OrchBalance { myself { clientBalance } }"
# runpodctl api/cloud.go GetCloud: the least bid (per GPU) and the on-demand price per GPU type
SPOT_QUERY = ("query OrchSpot($input: GpuLowestPriceInput!) { gpuTypes { id lowestPrice(input: $input) "
              "{ gpuTypeId minimumBidPrice uninterruptablePrice } } }")
# SkyPilot sky/provision/runpod/api/pods.py and dstack's runpod api_client: the spot pod's create
RENT_SPOT = ("mutation OrchRentSpot($input: PodRentInterruptableInput!) { podRentInterruptable(input: $input) "
             "{ id desiredStatus } }")


class RunPod(Marketplace):
    """RunPod pods for one API key."""

    name = "runpod"
    gone = "deleted"
    call = "pod"
    console = "https://console.runpod.io/pods"

    def __init__(self, token: str, api_url: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        base = api_url.rstrip("/") if api_url else None
        self.rest = JsonClient(self.name, f"{base}/v2" if base else REST_URL, headers)
        self.graphql = JsonClient(self.name, f"{base}/graphql" if base else GRAPHQL_URL, headers)

    def search(self, wanted: Wanted) -> list[Offer]:
        """``GET /catalog/gpus?include=AVAILABILITY&product=POD&count=N&cloud=C`` once per cloud
        (stock is reported for one cloud at a time): one offer per GPU type and cloud whose
        availability is not ``NONE``, the catalog's per-GPU price times ``count``, under
        ``max_price``, cheapest first. RunPod reports no reliability and sizes the disk at
        creation: those filters do not apply (``min_reliability`` of 0.99 or more keeps the
        secure cloud only)."""
        offers: list[Offer] = []
        for cloud in CLOUDS:
            if cloud == "COMMUNITY" and (wanted.min_reliability or 0) >= 0.99:
                continue
            answer = self.rest.request("GET", "/catalog/gpus", "search", query={
                "include": "AVAILABILITY", "product": "POD", "count": str(wanted.count), "cloud": cloud})
            gpus = answer.get("gpus") if isinstance(answer, dict) else None
            if not isinstance(gpus, list):
                raise ProviderError(self.name, "search", "answer has no gpus list")
            found = [o for o in (_offer(row, cloud, replace(wanted, interruptible=False, bid=None, max_price=None)
                                        if wanted.interruptible else wanted) for row in gpus) if o is not None]
            if wanted.interruptible and found:
                found = self._spot_offers(found, cloud, wanted)
            offers += found
        return sorted(offers, key=lambda o: o.price_per_hour)

    def _spot_offers(self, offers: list[Offer], cloud: str, wanted: Wanted) -> list[Offer]:
        """``offers`` (on demand, in ``cloud``) as spot offers: GraphQL ``lowestPrice`` per GPU
        type for ``wanted.count`` GPUs in that cloud, a ``minimumBidPrice`` above 0 (per GPU)
        where RunPod rents it interruptible (runpodctl shows "Reserved" otherwise); the bid
        ``wanted.bid_for`` the machine's minimum, on-demand the catalog's price."""
        answer = self.graphql.request("POST", "", "search", body={"query": SPOT_QUERY, "variables": {
            "input": {"gpuCount": wanted.count, "secureCloud": cloud == "SECURE"}}})
        rows = _graphql_data(answer, "search").get("gpuTypes")
        least: dict[str, float] = {}
        for row in rows if isinstance(rows, list) else []:
            price = row.get("lowestPrice") if isinstance(row, dict) else None
            each = _number(price.get("minimumBidPrice")) if isinstance(price, dict) else None
            kind = (price.get("gpuTypeId") if isinstance(price, dict) else None) or row.get("id")
            if isinstance(kind, str) and each is not None and each > 0:
                least[kind] = each
        spot = []
        for offer in offers:
            kind = dict(offer.ref).get("gpu_type", "")
            if kind not in least:
                continue
            bid = wanted.bid_for(round(least[kind] * offer.count, 4))
            if bid is None:
                continue
            per_gpu = round(bid / offer.count, 4)
            spot.append(replace(offer, price_per_hour=bid, bid=bid, on_demand_per_hour=offer.price_per_hour,
                                ref=offer.ref + (("bid_per_gpu", f"{per_gpu:g}"),
                                                 ("min_bid", f"{least[kind] * offer.count:g}"))))
        return spot

    def create(self, offer: Offer, image: str, disk_gb: int, label: str, public_key: str) -> str:
        """``POST /pods`` once: the new pod's id. ``disk_gb`` is the persistent mount at
        ``/workspace`` (kept while stopped); the container disk is 20 GB. A create that failed
        ambiguously (a timeout, HTTP 5xx) may still have made a billing pod: the pods are
        listed and one named ``label``, created since the request, is taken as the new pod
        (it is what was asked for, and ``orch release`` then removes it); with none or several,
        ``CreateUncertain`` says what it found."""
        ref = dict(offer.ref)
        if offer.bid is not None:
            return self._create_spot(offer, image, disk_gb, label, public_key)
        body = {"name": label, "image": image, "cloud": ref.get("cloud", "SECURE"),
                "gpu": {"id": ref.get("gpu_type", offer.gpu), "count": offer.count},
                "disk": CONTAINER_DISK_GB, "mounts": {"persistent": {"size": disk_gb, "path": "/workspace"}},
                "ports": ["22/tcp"], "env": {"PUBLIC_KEY": public_key}}
        started = time.time()
        try:
            answer = self.create_once("create", lambda: self.rest.request("POST", "/pods", "create", body=body))
        except CreateUncertain as exc:
            return self._made_anyway(exc, label, started)
        pod_id = answer.get("id") if isinstance(answer, dict) else None
        if not (isinstance(pod_id, str) and _ID.match(pod_id)):
            raise ProviderError(self.name, "create", "the answer names no new pod (id); look at your pods "
                                f"({self.console}) before trying again")
        return pod_id

    def _create_spot(self, offer: Offer, image: str, disk_gb: int, label: str, public_key: str) -> str:
        """GraphQL ``podRentInterruptable`` once, at the offer's ``bidPerGpu``: the same pod as
        ``create`` makes (container disk 20 GB, ``disk_gb`` at ``/workspace``, ``22/tcp``,
        ``PUBLIC_KEY``), with ``supportPublicIp`` (a community pod needs it for direct SSH). A
        refusal (a bid under RunPod's minimum, no machine) is RunPod's GraphQL error message."""
        ref = dict(offer.ref)
        spot = {"name": label, "imageName": image, "gpuTypeId": ref.get("gpu_type", offer.gpu),
                "gpuCount": offer.count, "bidPerGpu": float(ref.get("bid_per_gpu", "0")),
                "cloudType": ref.get("cloud", "SECURE"), "containerDiskInGb": CONTAINER_DISK_GB,
                "volumeInGb": disk_gb, "volumeMountPath": "/workspace", "ports": "22/tcp",
                "env": [{"key": "PUBLIC_KEY", "value": public_key}], "supportPublicIp": True}
        started = time.time()
        try:
            answer = self.create_once("create", lambda: _graphql_data(self.graphql.request(
                "POST", "", "create", body={"query": RENT_SPOT, "variables": {"input": spot}}), "create"))
        except CreateUncertain as exc:
            return self._made_anyway(exc, label, started)
        made = answer.get("podRentInterruptable") if isinstance(answer, dict) else None
        pod_id = made.get("id") if isinstance(made, dict) else None
        if not (isinstance(pod_id, str) and _ID.match(pod_id)):
            raise ProviderError(self.name, "create", "the answer names no new pod (id); look at your pods "
                                f"({self.console}) before trying again")
        return pod_id

    def _made_anyway(self, uncertain: CreateUncertain, label: str, started: float) -> str:
        """The pod an ambiguous create made, found by its name; else ``uncertain`` raised with
        what the lookup found."""
        try:
            pods = self._pods()
        except ProviderError as exc:
            raise CreateUncertain(self.name, "create", f"{uncertain.message} (looking for a pod named {label} "
                                  f"failed too: {exc.message})") from None
        made = [p["id"] for p in pods if p.get("name") == label and _made_since(p, started)]
        if len(made) == 1:
            return made[0]
        found = (f"pods named {label}: {', '.join(made)}; release the ones you do not want" if made
                 else f"no pod named {label} is listed now")
        raise CreateUncertain(self.name, "create", f"{uncertain.message} ({found})")

    def row(self, instance_id: str) -> dict[str, Any] | None:
        """``GET /pods/{id}``; None when RunPod no longer knows it (404)."""
        try:
            answer = self.rest.request("GET", _pod_path(instance_id), self.call)
        except ProviderError as exc:
            if exc.status == 404:
                return None
            raise
        if not isinstance(answer, dict):
            raise ProviderError(self.name, self.call, "answer holds no pod")
        return answer

    def row_state(self, row: dict[str, Any]) -> tuple[State, str]:
        """``status`` in orch's words; an ``EXITED`` pod that GraphQL calls a spot pod nobody
        stopped (``_interrupted``) is ``preempted``."""
        state, status = _state(row)
        if status == "EXITED" and self._interrupted(str(row.get("id") or "")) is True:
            return "preempted", "EXITED: interrupted (spot)"
        return state, status

    def instance(self, instance_id: str) -> Instance:
        found = super().instance(instance_id)
        return replace(found, interruptible=True) if found.state == "preempted" else found

    def _interrupted(self, pod_id: str) -> bool | None:
        """GraphQL ``pod(input: {podId}) { podType desiredStatus }``: True for a spot pod
        (``INTERRUPTABLE``) that is not meant to be stopped, False for another, None when
        GraphQL did not say (the state is then REST's alone)."""
        if not _ID.match(pod_id):
            return None
        query = f'query OrchPod {{ pod(input: {{podId: "{pod_id}"}}) {{ id podType desiredStatus }} }}'
        try:
            pod = _graphql_data(self.graphql.request("POST", "", self.call, body={"query": query}), self.call).get("pod")
        except ProviderError:
            return None
        if not isinstance(pod, dict):
            return None
        return pod.get("podType") == "INTERRUPTABLE" and pod.get("desiredStatus") not in ("EXITED", "TERMINATED")

    def row_price(self, row: dict[str, Any]) -> object:
        """``cost``: USD per hour now (0 while stopped)."""
        return _number(row.get("cost"))

    def row_ssh(self, row: dict[str, Any]) -> tuple[object, object]:
        return _direct_ssh(row)

    def instances(self) -> list[Instance]:
        """``GET /pods?includeClusterPods=true``: every pod the account holds (instant-cluster
        members too: they bill), deleted ones excepted."""
        found = []
        for pod in self._pods():
            state, status = self.row_state(pod)
            if state == "released":
                continue
            gpu = pod.get("gpu") if isinstance(pod.get("gpu"), dict) else {}
            kind, count = str(gpu.get("id") or "")[:60], gpu.get("count")
            price = _number(pod.get("cost"))
            found.append(Instance(id=pod["id"], state=state, status=status, currency="USD",
                                  price_per_hour=round(price, 4) if price is not None else None,
                                  label=str(pod.get("name") or "")[:80],
                                  gpu=f"{count}x {kind}" if kind and isinstance(count, int) else kind,
                                  created_at=_time(pod.get("createdAt")), interruptible=state == "preempted"))
        return found

    def _pods(self) -> list[dict[str, Any]]:
        """The list ``GET /pods`` answers: pods with a well-formed id only."""
        answer = self.rest.request("GET", "/pods", "list", query={"includeClusterPods": "true"})
        pods = answer.get("pods") if isinstance(answer, dict) else None
        if not isinstance(pods, list):
            raise ProviderError(self.name, "list", "answer has no pods list")
        return [p for p in pods if isinstance(p, dict) and isinstance(p.get("id"), str) and _ID.match(p["id"])]

    def balance(self) -> Balance | None:
        """GraphQL ``myself { clientBalance }`` (USD): REST v2 has no account route."""
        answer = self.graphql.request("POST", "", "balance", body={"query": BALANCE_QUERY})
        myself = _graphql_data(answer, "balance").get("myself")
        amount = _number(myself.get("clientBalance")) if isinstance(myself, dict) else None
        if amount is None:
            raise ProviderError(self.name, "balance", "answer holds no clientBalance")
        return Balance(amount=round(amount, 4), currency="USD")

    def power_on(self, instance_id: str) -> None:
        try:
            self._action(instance_id, "start")
        except ProviderError as exc:
            if not isinstance(exc, ProviderAuthError) and any(w in exc.message.lower() for w in _STOCK_WORDS):
                raise OutOfStock(self.name, "start", exc.message) from None
            raise

    def power_off(self, instance_id: str) -> None:
        self._action(instance_id, "stop")

    def _action(self, instance_id: str, action: str) -> None:
        """``POST /pods/{id}/action {"action": ...}``."""
        self.rest.request("POST", f"{_pod_path(instance_id)}/action", action, body={"action": action})

    def release(self, instance_id: str) -> None:
        """``DELETE /pods/{id}``: the pod and its persistent mount are gone, in any state."""
        self.rest.request("DELETE", _pod_path(instance_id), "delete")


def _offer(row: object, cloud: str, wanted: Wanted) -> Offer | None:
    """One catalog row as an offer in ``cloud``; None when it does not match or has no stock."""
    if not isinstance(row, dict) or not isinstance(row.get("id"), str) or not _GPU_TYPE.match(row["id"]):
        return None
    name = str(row.get("name") or row["id"])[:60]
    key = cloud.lower()
    prices, most = row.get("price"), row.get("maxCount")
    each = _number(prices.get(key)) if isinstance(prices, dict) else None
    stock = row.get("availability")
    if (not wanted.gpu_matches(row["id"], name) or row.get(key) is not True or each is None or each <= 0
            or stock not in ("LOW", "MEDIUM", "HIGH")):
        return None
    if isinstance(most, dict) and isinstance(most.get(key), int) and most[key] < wanted.count:
        return None
    total = round(each * wanted.count, 4)  # the catalog's price is for one GPU
    if wanted.max_price is not None and total > wanted.max_price:
        return None
    memory = _number(row.get("memory"))
    return Offer(provider=RunPod.name, id=f"{row['id']} ({key})", gpu=name, count=wanted.count,
                 price_per_hour=total, where=f"{key} cloud, stock {stock.lower()}",
                 gpu_memory_gb=memory, ref=(("gpu_type", row["id"]), ("cloud", cloud)))


def _number(value: object) -> float | None:
    """A price or amount as RunPod writes it: a JSON number, or a numeric string; None else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and re.fullmatch(r"\d{1,9}(\.\d{1,9})?", value.strip()):
        return float(value)
    return None


def _pod_path(instance_id: str) -> str:
    return "/pods/" + urllib.parse.quote(instance_id, safe="")


def _time(value: object) -> datetime | None:
    """An RFC 3339 time (``2026-06-01T12:00:00Z``); None when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value[:40].replace("Z", "+00:00"))
    except ValueError:
        return None


def _made_since(pod: dict[str, Any], started: float) -> bool:
    """Whether ``pod`` may have been made by a request sent at ``started`` (not deleted, and
    created no earlier than that, give or take the clocks' difference)."""
    created = _time(pod.get("createdAt"))
    fresh = created is None or created.tzinfo is None or created.timestamp() >= started - _CLOCK_SLACK_S
    return pod.get("status") != "TERMINATED" and fresh


def _direct_ssh(pod: dict[str, Any]) -> tuple[object, object]:
    """``ssh.direct``'s host and port; else the ``runtime.ports`` entry with ``private`` 22 over
    tcp (its ``ip`` and ``public``); (None, None) while there is neither."""
    ssh = pod.get("ssh")
    direct = ssh.get("direct") if isinstance(ssh, dict) else None
    if isinstance(direct, dict):
        return direct.get("host"), direct.get("port")
    runtime = pod.get("runtime")
    ports = runtime.get("ports") if isinstance(runtime, dict) else None
    for port in ports if isinstance(ports, list) else []:
        if isinstance(port, dict) and port.get("private") == 22 and port.get("type") == "tcp":
            return port.get("ip"), port.get("public")
    return None, None


def _graphql_data(answer: object, call: str) -> dict[str, Any]:
    """GraphQL's ``data``; its first error (an HTTP 200) as a ``ProviderError``."""
    if not isinstance(answer, dict):
        raise ProviderError(RunPod.name, call, "answer is not a GraphQL response")
    errors = answer.get("errors")
    if isinstance(errors, list) and errors:
        first = errors[0] if isinstance(errors[0], dict) else {}
        msg = str(first.get("message") or errors[0])[:300]
        if any(word in msg.lower() for word in ("unauthorized", "api key", "authenticat")):
            raise ProviderAuthError(RunPod.name, call, msg)
        raise ProviderError(RunPod.name, call, msg)
    data = answer.get("data")
    if not isinstance(data, dict):
        raise ProviderError(RunPod.name, call, "answer holds no data")
    return data


def _state(pod: dict[str, Any]) -> tuple[State, str]:
    """``status`` in orch's words; a running pod without its SSH endpoint yet is starting."""
    status = str(pod.get("status") or "")[:40]
    state = STATES.get(status, "unknown")
    if state == "running" and _direct_ssh(pod) == (None, None):
        return "starting", status
    return state, status

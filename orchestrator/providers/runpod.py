"""RunPod through its REST API (``rest.runpod.io/v1``) and, for prices, its GraphQL API
(docs/providers.md cites every call used).

The REST API has pods (create, get, start, stop, delete) but no GPU prices or stock, so
``search`` asks GraphQL's ``gpuTypes { lowestPrice }`` once per search: one offer per GPU type
and cloud (secure, community) that has stock. The API key goes in ``Authorization: Bearer KEY``
on both (never in the URL, although RunPod's own clients put it there for GraphQL). A pod is
created with port ``22/tcp`` on a public IP and orch's public key in its ``PUBLIC_KEY``
variable, which RunPod's images put in ``authorized_keys``; its SSH endpoint is ``publicIp`` and
``portMappings["22"]``, user root. A stopped pod keeps only its volume (``/workspace``); its
container disk is wiped, so orch's root on a RunPod host is ``/workspace/orch``. Prices are USD
per hour. ``--api-url URL`` serves both: REST under ``URL/v1``, GraphQL at ``URL/graphql``.
"""

from __future__ import annotations

import re
from typing import Any

from orchestrator.providers.api import (Marketplace, Offer, OutOfStock, ProviderAuthError, ProviderError, State,
                                        Wanted)
from orchestrator.providers.http import JsonClient

REST_URL = "https://rest.runpod.io/v1"
GRAPHQL_URL = "https://api.runpod.io/graphql"
ROOT = "/workspace/orch"
_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_GPU_TYPE = re.compile(r"^[A-Za-z0-9 ._()-]{1,80}$")
_STOCK_WORDS = ("not enough free gpu", "no longer any instances available", "no instances available",
                "out of stock", "insufficient capacity")
STATES: dict[str, State] = {"RUNNING": "running", "EXITED": "off", "TERMINATED": "released",
                            "CREATED": "creating", "RESTARTING": "starting"}

PRICES = """query OrchPrices($n: Int!) {
  gpuTypes {
    id displayName memoryInGb secureCloud communityCloud
    secure: lowestPrice(input: {gpuCount: $n, secureCloud: true}) { uninterruptablePrice stockStatus }
    community: lowestPrice(input: {gpuCount: $n, secureCloud: false}) { uninterruptablePrice stockStatus }
  }
}"""


class RunPod(Marketplace):
    """RunPod pods for one API key."""

    name = "runpod"
    gone = "deleted"
    call = "pod"
    console = "https://console.runpod.io/pods"

    def __init__(self, token: str, api_url: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        base = api_url.rstrip("/") if api_url else None
        self.rest = JsonClient(self.name, f"{base}/v1" if base else REST_URL, headers)
        self.graphql = JsonClient(self.name, f"{base}/graphql" if base else GRAPHQL_URL, headers)

    def search(self, wanted: Wanted) -> list[Offer]:
        """GraphQL ``gpuTypes``: for each GPU type that matches, the lowest on-demand price of
        ``count`` GPUs in each cloud with stock, under ``max_price``, cheapest first. RunPod
        reports no reliability and sizes the disk at creation: those filters do not apply
        (``min_reliability`` of 0.99 or more keeps the secure cloud only)."""
        answer = self.graphql.request("POST", "", "search", body={"query": PRICES, "variables": {"n": wanted.count}})
        types = _graphql_data(answer, "search").get("gpuTypes")
        if not isinstance(types, list):
            raise ProviderError(self.name, "search", "answer has no gpuTypes list")
        offers: list[Offer] = []
        for row in types:
            if not isinstance(row, dict) or not isinstance(row.get("id"), str) or not _GPU_TYPE.match(row["id"]):
                continue
            name = str(row.get("displayName") or row["id"])[:60]
            if not wanted.gpu_matches(row["id"], name):
                continue
            for cloud in ("secure", "community"):
                if cloud == "community" and (wanted.min_reliability or 0) >= 0.99:
                    continue
                price = row.get(cloud)
                each = price.get("uninterruptablePrice") if isinstance(price, dict) else None
                if not isinstance(each, (int, float)) or each <= 0 or not price.get("stockStatus"):
                    continue
                total = round(float(each) * wanted.count, 4)  # lowestPrice is per GPU
                if wanted.max_price is not None and total > wanted.max_price:
                    continue
                memory = row.get("memoryInGb")
                offers.append(Offer(provider=self.name, id=f"{row['id']} ({cloud})", gpu=name, count=wanted.count,
                                    price_per_hour=total, where=f"{cloud} cloud, stock {price['stockStatus']}"[:40],
                                    gpu_memory_gb=float(memory) if isinstance(memory, (int, float)) else None,
                                    ref=(("gpu_type", row["id"]), ("cloud", cloud.upper()))))
        return sorted(offers, key=lambda o: o.price_per_hour)

    def create(self, offer: Offer, image: str, disk_gb: int, label: str, public_key: str) -> str:
        """``POST /pods`` once: the new pod's id. ``disk_gb`` is the volume at ``/workspace``
        (kept while stopped); the container disk is RunPod's default 20 GB."""
        ref = dict(offer.ref)
        body = {"name": label, "imageName": image, "gpuTypeIds": [ref.get("gpu_type", offer.gpu)],
                "gpuCount": offer.count, "cloudType": ref.get("cloud", "SECURE"), "containerDiskInGb": 20,
                "volumeInGb": disk_gb, "volumeMountPath": "/workspace", "ports": ["22/tcp"],
                "supportPublicIp": True, "env": {"PUBLIC_KEY": public_key}}
        answer = self.create_once("create", lambda: self.rest.request("POST", "/pods", "create", body=body))
        pod_id = answer.get("id") if isinstance(answer, dict) else None
        if not (isinstance(pod_id, str) and _ID.match(pod_id)):
            raise ProviderError(self.name, "create", "the answer names no new pod (id); look at your pods "
                                f"({self.console}) before trying again")
        return pod_id

    def row(self, instance_id: str) -> dict[str, Any] | None:
        """``GET /pods/{id}``; None when RunPod no longer knows it (404)."""
        try:
            answer = self.rest.request("GET", f"/pods/{instance_id}", self.call)
        except ProviderError as exc:
            if exc.status == 404:
                return None
            raise
        if not isinstance(answer, dict):
            raise ProviderError(self.name, self.call, "answer holds no pod")
        return answer

    def row_state(self, row: dict[str, Any]) -> tuple[State, str]:
        return _state(row)

    def row_price(self, row: dict[str, Any]) -> object:
        return row.get("costPerHr")

    def row_ssh(self, row: dict[str, Any]) -> tuple[object, object]:
        """``publicIp`` and ``portMappings["22"]``: the public port of the pod's sshd."""
        ports = row.get("portMappings")
        return row.get("publicIp"), ports.get("22") if isinstance(ports, dict) else None

    def power_on(self, instance_id: str) -> None:
        try:
            self.rest.request("POST", f"/pods/{instance_id}/start", "start")
        except ProviderError as exc:
            if not isinstance(exc, ProviderAuthError) and any(w in exc.message.lower() for w in _STOCK_WORDS):
                raise OutOfStock(self.name, "start", exc.message) from None
            raise

    def power_off(self, instance_id: str) -> None:
        self.rest.request("POST", f"/pods/{instance_id}/stop", "stop")

    def release(self, instance_id: str) -> None:
        """``DELETE /pods/{id}``: the pod and its volume are gone, in any state."""
        self.rest.request("DELETE", f"/pods/{instance_id}", "delete")


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
    """``desiredStatus`` in orch's words; a running pod without its SSH port yet is starting."""
    status = str(pod.get("desiredStatus") or "")[:40]
    state = STATES.get(status, "unknown")
    if state == "running":
        ports = pod.get("portMappings")
        if not pod.get("publicIp") or not (isinstance(ports, dict) and ports.get("22")):
            return "starting", status
    return state, status

"""vast.ai through its REST API (``/api/v0``; docs/providers.md cites every path used).

The API key goes in ``Authorization: Bearer KEY`` (never in the URL, although vast's own client
also puts it there). Offers are searched with ``POST /bundles/`` and rented with
``PUT /asks/{offer}/`` (``runtype: ssh``: vast runs an sshd in any image); orch's public key is
attached to the new instance with ``POST /instances/{id}/ssh/``. Start and stop are
``PUT /instances/{id}/`` with ``{"state": "running" | "stopped"}``; destroy is ``DELETE``. A
stopped instance keeps its disk (billed as storage) and may not get its GPU back while another
renter holds it. Prices are USD per hour (``dph_total``: GPUs, disk and the rest). Every field
of an answer is checked before use; a missing or odd one is a ``ProviderError``, never a guess.
vast's official SDK is not used: it retries every request, creation included, after a timeout
or an HTTP 5xx, and puts the key in the URL.
"""

from __future__ import annotations

from typing import Any

from orchestrator.providers.api import Marketplace, Offer, OutOfStock, ProviderError, State, Wanted
from orchestrator.providers.http import JsonClient

API_URL = "https://console.vast.ai"
BASE = "/api/v0"
SEARCH_LIMIT = 64
DEFAULT_RELIABILITY = 0.95
_STOCK_WORDS = ("no_such_ask", "not available", "unavailable", "already rented", "insufficient")


class Vast(Marketplace):
    """vast.ai instances for one API key."""

    name = "vast"
    console = "https://cloud.vast.ai/instances/"

    def __init__(self, token: str, api_url: str | None = None) -> None:
        self.http = JsonClient(self.name, (api_url or API_URL).rstrip("/") + BASE,
                               {"Authorization": f"Bearer {token}"})

    def _call(self, method: str, path: str, call: str, body: dict[str, Any] | None = None,
              query: dict[str, str] | None = None) -> Any:
        """One request; an answer ``{"success": false, "msg"/"error": ...}`` is an error."""
        answer = self.http.request(method, path, call, body=body, query=query)
        if isinstance(answer, dict) and answer.get("success") is False:
            msg = str(answer.get("msg") or answer.get("error") or "refused")[:300]
            raise ProviderError(self.name, call, msg)
        return answer

    def search(self, wanted: Wanted) -> list[Offer]:
        """``POST /bundles/``: verified, rentable on-demand offers with ``count`` GPUs, at
        least ``disk_gb`` of disk and the reliability asked (0.95 unless said), under the
        price, cheapest first; the GPU name matched here as well (vast spells names with
        spaces: ``RTX 4090``)."""
        reliability = DEFAULT_RELIABILITY if wanted.min_reliability is None else wanted.min_reliability
        query: dict[str, Any] = {
            "verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True}, "rented": {"eq": False},
            "gpu_name": {"eq": wanted.gpu.replace("_", " ")}, "num_gpus": {"eq": wanted.count},
            "disk_space": {"gte": wanted.disk_gb}, "reliability2": {"gte": reliability},
            "order": [["dph_total", "asc"]], "type": "on-demand", "allocated_storage": wanted.disk_gb,
            "limit": SEARCH_LIMIT,
        }
        if wanted.max_price is not None:
            query["dph_total"] = {"lte": wanted.max_price}
        answer = self._call("POST", "/bundles/", "search", body=query)
        rows = answer.get("offers") if isinstance(answer, dict) else None
        if not isinstance(rows, list):
            raise ProviderError(self.name, "search", "answer has no offer list")
        offers = [offer for offer in (self._offer(row) for row in rows) if offer is not None
                  and wanted.gpu_matches(offer.gpu) and offer.count == wanted.count
                  and (wanted.max_price is None or offer.price_per_hour <= wanted.max_price)
                  and (offer.disk_gb is None or offer.disk_gb >= wanted.disk_gb)
                  and (offer.reliability is None or offer.reliability >= reliability)]
        return sorted(offers, key=lambda o: o.price_per_hour)

    def _offer(self, row: object) -> Offer | None:
        """An offer row, or None when a field orch needs is missing or odd."""
        if not isinstance(row, dict):
            return None
        offer_id, gpu, count, price = row.get("id"), row.get("gpu_name"), row.get("num_gpus"), row.get("dph_total")
        if not (isinstance(offer_id, int) and isinstance(gpu, str) and isinstance(count, int)
                and isinstance(price, (int, float)) and price >= 0):
            return None
        reliability = row.get("reliability2", row.get("reliability"))
        disk, memory = row.get("disk_space"), row.get("gpu_ram")
        return Offer(provider=self.name, id=str(offer_id), gpu=gpu[:60], count=count, price_per_hour=float(price),
                     gpu_memory_gb=round(memory / 1024) if isinstance(memory, (int, float)) and memory > 0 else None,
                     disk_gb=float(disk) if isinstance(disk, (int, float)) else None,
                     reliability=float(reliability) if isinstance(reliability, (int, float)) else None,
                     where=str(row.get("geolocation") or "")[:40])

    def create(self, offer: Offer, image: str, disk_gb: int, label: str, public_key: str) -> str:
        """``PUT /asks/{offer}/`` once: the new contract's id. The key is attached afterwards
        (``authorize_key``): vast takes per-instance keys only for an existing instance."""
        body = {"client_id": "me", "image": image, "disk": disk_gb, "label": label, "runtype": "ssh", "env": {}}
        answer = self.create_once("create", lambda: self._call("PUT", f"/asks/{offer.id}/", "create", body=body))
        new = answer.get("new_contract") if isinstance(answer, dict) else None
        if not isinstance(new, int):
            raise ProviderError(self.name, "create", "the answer names no new instance (new_contract); look at your "
                                f"instances ({self.console}) before trying again")
        return str(new)

    def authorize_key(self, instance_id: str, public_key: str) -> None:
        self._call("POST", f"/instances/{instance_id}/ssh/", "attach-ssh", body={"ssh_key": public_key})

    def row(self, instance_id: str) -> dict[str, Any] | None:
        """``GET /instances/{id}/``: the instance's row, None once it is destroyed."""
        answer = self._call("GET", f"/instances/{instance_id}/", "instance", query={"owner": "me"})
        if not isinstance(answer, dict) or "instances" not in answer:
            raise ProviderError(self.name, "instance", "answer holds no instance")
        row = answer["instances"]
        if row is None or row == [] or row == {}:
            return None
        if not isinstance(row, dict):
            raise ProviderError(self.name, "instance", "answer holds no instance")
        return row

    def row_state(self, row: dict[str, Any]) -> tuple[State, str]:
        return _state(row)

    def row_price(self, row: dict[str, Any]) -> object:
        return row.get("dph_total")

    def row_ssh(self, row: dict[str, Any]) -> tuple[object, object]:
        """``ssh_host``/``ssh_port``: vast's SSH proxy to the instance."""
        return row.get("ssh_host"), row.get("ssh_port")

    def power_on(self, instance_id: str) -> None:
        try:
            self._call("PUT", f"/instances/{instance_id}/", "start", body={"state": "running"})
        except ProviderError as exc:
            if any(word in exc.message.lower() for word in _STOCK_WORDS):
                raise OutOfStock(self.name, "start", exc.message) from None
            raise

    def power_off(self, instance_id: str) -> None:
        self._call("PUT", f"/instances/{instance_id}/", "stop", body={"state": "stopped"})

    def release(self, instance_id: str) -> None:
        """``DELETE /instances/{id}/``: destroyed in any state, its disk with it."""
        self._call("DELETE", f"/instances/{instance_id}/", "destroy", body={})


def _state(row: dict[str, Any]) -> tuple[State, str]:
    """orch's word from ``actual_status`` (what runs) and ``intended_status`` (what was asked)."""
    actual = str(row.get("actual_status") or "")[:40]
    intended = str(row.get("intended_status") or "")[:40]
    if actual == "running":
        return ("stopping" if intended == "stopped" else "running"), actual
    if actual in ("exited", "stopped", "offline") and intended != "running":
        return "off", actual or intended
    if intended == "stopped":
        return "off", actual or intended
    if actual in ("", "created", "loading", "scheduling") or intended == "running":
        return ("creating" if actual in ("", "created") else "starting"), actual or "loading"
    return "unknown", actual

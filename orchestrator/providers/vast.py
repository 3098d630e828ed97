"""vast.ai through its REST API (docs/providers.md cites the source of every path and field used).

The API key goes in ``Authorization: Bearer KEY`` (never in the URL, although vast allows it).
Offers are searched with ``POST /api/v0/bundles/`` and rented with ``PUT /api/v0/asks/{offer}/``
(``runtype`` ``ssh_direc ssh_proxy`` where the offer has open ports, ``ssh_proxy`` otherwise, as
the official client's ``--ssh [--direct]``); orch's public key is attached to the new instance
with ``POST /api/v0/instances/{id}/ssh/``. One instance is ``GET /api/v0/instances/{id}/``; the
account's instances are the paged ``GET /api/v1/instances/`` that the official client moved to
(the v0 list, being retired, is the fallback while it answers). Start and stop are
``PUT /api/v0/instances/{id}/`` with ``{"state": "running" | "stopped"}``; destroy is ``DELETE``;
the credit is ``GET /api/v0/users/current/``. A stopped instance keeps its disk (billed as
storage) and may not get its GPU back while another renter holds it. Prices are USD per hour
(``dph_total``: GPUs, disk and the rest).

Interruptible instances (vast's bids): the search asks ``type: bid``, whose offers carry
``min_bid`` (USD per hour for the machine); the create sends ``price`` (the bid), which makes
the instance interruptible (without it vast rents on demand at ``dph_total``); ``PUT
/api/v0/instances/bid_price/{id}/`` changes the bid. An instance outbid is paused, its disk
kept, until its bid is the highest again: ``actual_status`` ``stopped`` while
``intended_status`` is still ``running``, on a row whose ``is_bid`` is true, is ``preempted``.

A refused key: vast answers 401 ``Invalid user key`` (the official client), and 404 with an auth
error to some keys; both are ``ProviderAuthError``. Every field of an answer is checked before
use; a missing or odd one is a ``ProviderError``, never a guess. vast's official SDK is not used:
it retries every request, creation included, after a timeout or an HTTP 5xx.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

from orchestrator.providers.api import (Balance, CreateUncertain, Instance, Marketplace, Offer, OutOfStock,
                                        ProviderAuthError, ProviderError, ProviderUnreachable, State, Wanted)
from orchestrator.providers.http import JsonClient

API_URL = "https://console.vast.ai"
BASE, BASE_V1 = "/api/v0", "/api/v1"
SEARCH_LIMIT = 64
PAGE = 25  # the v1 list's largest page
MAX_PAGES = 40  # 1,000 instances: more is an answer orch does not trust
DEFAULT_RELIABILITY = 0.95
_STOCK_WORDS = ("no_such_ask", "not available", "unavailable", "already rented", "insufficient")
# A 404 that is vast refusing the key, not a missing thing (its words, lowercased).
_AUTH_WORDS = ("auth_error", "invalid user key", "session expired", "api key", "api_key", "unauthorized")
# A list path vast has retired answers one of these (the v0 list answers 410 to some clients).
_RETIRED = (404, 405, 410)
# The bid range vast's API reference gives for ``price`` (docs.vast.ai/api-reference/instances/
# create-instance: 0.001 <= x <= 128; change-bid: 0.001 <= x <= 32).
BID_MIN, BID_MAX, CHANGE_BID_MAX = 0.001, 128.0, 32.0
# how far an instance's start_date may lie before the create request and still be its own
_CLOCK_SLACK_S = 600.0


class Vast(Marketplace):
    """vast.ai instances for one API key."""

    name = "vast"
    console = "https://cloud.vast.ai/instances/"

    def __init__(self, token: str, api_url: str | None = None) -> None:
        root = (api_url or API_URL).rstrip("/")
        headers = {"Authorization": f"Bearer {token}"}
        self.http = JsonClient(self.name, root + BASE, headers)
        self.http_v1 = JsonClient(self.name, root + BASE_V1, headers)

    def _call(self, method: str, path: str, call: str, body: dict[str, Any] | None = None,
              query: dict[str, str] | None = None, v1: bool = False) -> Any:
        """One request; an answer ``{"success": false, "msg"/"error": ...}`` is an error, a 404
        in the words of a refused key is ``ProviderAuthError``."""
        try:
            answer = (self.http_v1 if v1 else self.http).request(method, path, call, body=body, query=query)
        except ProviderError as exc:
            if exc.status == 404 and any(word in exc.message.lower() for word in _AUTH_WORDS):
                said, _, words = exc.message.partition(": ")
                raise ProviderAuthError(self.name, call, f"the token was refused ({said})" + (f": {words}" if words
                                                                                              else ""), status=404) from None
            raise
        if isinstance(answer, dict) and answer.get("success") is False:
            msg = str(answer.get("msg") or answer.get("error") or "refused")[:300]
            raise ProviderError(self.name, call, msg)
        return answer

    def search(self, wanted: Wanted) -> list[Offer]:
        """``POST /bundles/``: verified, rentable on-demand offers with ``count`` GPUs, at
        least ``disk_gb`` of disk and the reliability asked (0.95 unless said; the field the
        official client filters on, ``reliability``), under the price, cheapest first; the GPU
        name matched here as well (vast spells names with spaces: ``RTX 4090``).
        ``wanted.interruptible``: ``type: bid`` (the official client's ``search offers --type
        bid``), each offer at the bid ``wanted.bid_for`` its ``min_bid`` places, under the cap
        (``min_bid`` filtered on: an offer field of the official client's query)."""
        reliability = DEFAULT_RELIABILITY if wanted.min_reliability is None else wanted.min_reliability
        query: dict[str, Any] = {
            "verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True}, "rented": {"eq": False},
            "gpu_name": {"eq": wanted.gpu.replace("_", " ")}, "num_gpus": {"eq": wanted.count},
            "disk_space": {"gte": wanted.disk_gb}, "reliability": {"gte": reliability},
            "order": [["min_bid" if wanted.interruptible else "dph_total", "asc"]],
            "type": "bid" if wanted.interruptible else "on-demand", "allocated_storage": wanted.disk_gb,
            "limit": SEARCH_LIMIT,
        }
        cap = wanted.bid if wanted.bid is not None else wanted.max_price
        if wanted.interruptible and cap is not None:
            query["min_bid"] = {"lte": cap}
        elif wanted.max_price is not None:
            query["dph_total"] = {"lte": wanted.max_price}
        answer = self._call("POST", "/bundles/", "search", body=query)
        rows = answer.get("offers") if isinstance(answer, dict) else None
        if not isinstance(rows, list):
            raise ProviderError(self.name, "search", "answer has no offer list")
        offers = [offer for offer in (self._offer(row, wanted) for row in rows) if offer is not None
                  and wanted.gpu_matches(offer.gpu) and offer.count == wanted.count
                  and (wanted.max_price is None or offer.price_per_hour <= wanted.max_price)
                  and (offer.disk_gb is None or offer.disk_gb >= wanted.disk_gb)
                  and (offer.reliability is None or offer.reliability >= reliability)]
        return sorted(offers, key=lambda o: o.price_per_hour)

    def _offer(self, row: object, wanted: Wanted) -> Offer | None:
        """An offer row, or None when a field orch needs is missing or odd. ``ref`` says
        whether the machine has open ports for direct SSH (``direct_port_count``); an
        interruptible one is priced at its bid, ``dph_total`` its on-demand price, and needs a
        ``min_bid`` the bid reaches."""
        if not isinstance(row, dict):
            return None
        offer_id, gpu, count, price = row.get("id"), row.get("gpu_name"), row.get("num_gpus"), row.get("dph_total")
        if not (isinstance(offer_id, int) and isinstance(gpu, str) and isinstance(count, int)
                and isinstance(price, (int, float)) and price >= 0):
            return None
        bid: float | None = None
        if wanted.interruptible:
            least = row.get("min_bid")
            if not (isinstance(least, (int, float)) and not isinstance(least, bool) and least > 0):
                return None
            bid = wanted.bid_for(max(float(least), BID_MIN))
            if bid is None or bid > BID_MAX:
                return None
        reliability = row.get("reliability", row.get("reliability2"))
        disk, memory, ports = row.get("disk_space"), row.get("gpu_ram"), row.get("direct_port_count")
        direct = isinstance(ports, int) and ports > 0
        return Offer(provider=self.name, id=str(offer_id), gpu=gpu[:60], count=count,
                     price_per_hour=float(price) if bid is None else bid,
                     gpu_memory_gb=round(memory / 1024) if isinstance(memory, (int, float)) and memory > 0 else None,
                     disk_gb=float(disk) if isinstance(disk, (int, float)) else None,
                     reliability=float(reliability) if isinstance(reliability, (int, float)) else None,
                     where=str(row.get("geolocation") or "")[:40],
                     ref=(("direct", "yes" if direct else "no"),) + ((("min_bid", f"{row['min_bid']:g}"),) if bid else ()),
                     bid=bid, on_demand_per_hour=float(price) if bid is not None else None)

    def create(self, offer: Offer, image: str, disk_gb: int, label: str, public_key: str) -> str:
        """``PUT /asks/{offer}/`` once: the new contract's id. Direct SSH where the offer has
        open ports (vast's proxy as well, as the official client's ``--ssh --direct``), the
        proxy only otherwise. The key is attached afterwards (``authorize_key``): vast takes
        per-instance keys only for an existing instance."""
        runtype = "ssh_direc ssh_proxy" if dict(offer.ref).get("direct") == "yes" else "ssh_proxy"
        body: dict[str, Any] = {"client_id": "me", "image": image, "disk": disk_gb, "label": label,
                                "runtype": runtype, "env": {}}
        if offer.bid is not None:
            body["price"] = offer.bid  # an interruptible instance at this bid (vast-cli --bid_price)
        started = time.time()
        try:
            answer = self.create_once("create", lambda: self._created(offer, body))
        except ProviderError as exc:
            if offer.bid is None or isinstance(exc, (ProviderAuthError, ProviderUnreachable, CreateUncertain)):
                raise
            raise self._refused_bid(exc, offer, label, started) from None
        new = answer.get("new_contract") if isinstance(answer, dict) else None
        if not isinstance(new, int):
            raise ProviderError(self.name, "create", "the answer names no new instance (new_contract); look at your "
                                f"instances ({self.console}) before trying again")
        return str(new)

    def _created(self, offer: Offer, body: dict[str, Any]) -> Any:
        """The create request; a refused one (``success: false``) that names the instance it
        made anyway (``new_contract``: vast makes an interruptible instance whose bid is too
        low, stopped, and answers an error — dstack's vast adapter) carries that id in the
        error's message for ``_refused_bid``."""
        try:
            answer = self.http.request("PUT", f"/asks/{offer.id}/", "create", body=body)
        except ProviderError as exc:
            if exc.status == 404 and any(word in exc.message.lower() for word in _AUTH_WORDS):
                raise ProviderAuthError(self.name, "create", f"the token was refused ({exc.message})",
                                        status=404) from None
            raise
        if isinstance(answer, dict) and answer.get("success") is False:
            msg = str(answer.get("msg") or answer.get("error") or "refused")[:300]
            made = answer.get("new_contract")
            raise ProviderError(self.name, "create", msg + (f" [new_contract {made}]" if isinstance(made, int) else ""))
        return answer

    def _refused_bid(self, exc: ProviderError, offer: Offer, label: str, started: float) -> ProviderError:
        """A refused interruptible create, in vast's words with the bid and the offer's minimum;
        an instance it left behind (named in the answer, else listed under ``label`` since the
        request) is destroyed, so nothing bills for a rental that did not happen."""
        words = exc.message
        made: list[str] = []
        if "[new_contract " in words:
            words, _, tail = words.partition(" [new_contract ")
            made = [tail.rstrip("]")]
        else:
            try:
                made = [str(r["id"]) for r in self._rows_v1({"label": {"eq": label}})
                        if r.get("label") == label and _since(r, started)]
            except ProviderError:
                made = []
        gone = []
        for instance_id in made:
            try:
                self.release(instance_id)
                gone.append(instance_id)
            except ProviderError:
                pass
        left = [i for i in made if i not in gone]
        note = (f"; the stopped instance it left ({', '.join(gone)}) was destroyed" if gone else "") + (
            f"; instance {', '.join(left)} it left could not be destroyed: destroy it at {self.console}" if left else "")
        least = dict(offer.ref).get("min_bid", "?")
        return ProviderError(self.name, "create", f"{words} (orch bid {offer.bid:g} USD/h; the offer's minimum bid "
                             f"was {least} USD/h when searched){note}", status=exc.status)

    def change_bid(self, instance_id: str, bid: float) -> None:
        """``PUT /instances/bid_price/{id}/`` with ``{"client_id": "me", "price": bid}``
        (docs.vast.ai/api-reference/instances/change-bid; vast-cli ``change_bid``)."""
        if not BID_MIN <= bid <= CHANGE_BID_MAX:
            raise ProviderError(self.name, "change bid", f"a bid is {BID_MIN:g} to {CHANGE_BID_MAX:g} USD/h, "
                                f"not {bid:g}")
        self._call("PUT", f"/instances/bid_price/{instance_id}/", "change bid", body={"client_id": "me", "price": bid})

    def authorize_key(self, instance_id: str, public_key: str) -> None:
        self._call("POST", f"/instances/{instance_id}/ssh/", "attach-ssh", body={"ssh_key": public_key})

    def row(self, instance_id: str) -> dict[str, Any] | None:
        """``GET /instances/{id}/?owner=me``: the instance's row, None once it is destroyed;
        where that path is retired, the v1 list filtered on the id."""
        try:
            answer = self._call("GET", f"/instances/{instance_id}/", "instance", query={"owner": "me"})
        except ProviderAuthError:
            raise
        except ProviderError as exc:
            if exc.status not in (405, 410) or not instance_id.isdigit():
                raise
            rows = self._rows_v1({"id": {"eq": int(instance_id)}})
            return next((r for r in rows if str(r.get("id")) == instance_id), None)
        if not isinstance(answer, dict) or "instances" not in answer:
            raise ProviderError(self.name, "instance", "answer holds no instance")
        row = answer["instances"]
        if row is None or row == [] or row == {}:
            return None
        if not isinstance(row, dict):
            raise ProviderError(self.name, "instance", "answer holds no instance")
        return row

    def instance(self, instance_id: str) -> Instance:
        """The instance as ``GET /instances/{id}/`` reports it, with its label, GPUs and start."""
        row = self.row(instance_id)
        if row is None:
            return Instance(id=instance_id, state="released", status=self.gone)
        return self._listed({**row, "id": instance_id})

    def instances(self) -> list[Instance]:
        """Every instance of the account: ``GET /api/v1/instances/`` page by page (the
        official client's ``show_instances``), else the v0 list where v1 is not served."""
        try:
            rows = self._rows_v1({})
        except ProviderAuthError:
            raise
        except ProviderError as exc:
            if exc.status not in _RETIRED:
                raise
            answer = self._call("GET", "/instances/", "instances", query={"owner": "me"})
            rows = answer.get("instances") if isinstance(answer, dict) else None
            if not isinstance(rows, list):
                raise ProviderError(self.name, "instances", "answer has no instance list") from None
        return [self._listed(row) for row in rows if isinstance(row, dict) and isinstance(row.get("id"), int)]

    def _rows_v1(self, filters: dict[str, Any]) -> list[dict[str, Any]]:
        """The v1 list's rows matching ``filters``, following ``next_token`` (at most
        ``MAX_PAGES`` pages). Query values are JSON, as the official client sends them."""
        rows: list[dict[str, Any]] = []
        query = {"select_filters": json.dumps(filters), "order_by": json.dumps([{"col": "id", "dir": "asc"}]),
                 "limit": str(PAGE)}
        for _ in range(MAX_PAGES):
            answer = self._call("GET", "/instances/", "instances", query=query, v1=True)
            page = answer.get("instances") if isinstance(answer, dict) else None
            if not isinstance(page, list):
                raise ProviderError(self.name, "instances", "answer has no instance list")
            rows.extend(row for row in page if isinstance(row, dict))
            token = answer.get("next_token")
            if not token:
                return rows
            if not isinstance(token, str) or len(token) > 512:
                raise ProviderError(self.name, "instances", "answer has an odd next_token")
            query["after_token"] = token
        raise ProviderError(self.name, "instances", f"more than {MAX_PAGES * PAGE} instances listed; "
                            f"look at {self.console}")

    def _listed(self, row: dict[str, Any]) -> Instance:
        """One list row as an ``Instance`` (label, GPUs and start time where given)."""
        state, status = _state(row)
        price, gpu, count, start = row.get("dph_total"), row.get("gpu_name"), row.get("num_gpus"), row.get("start_date")
        words = f"{count}x {gpu}" if isinstance(count, int) and isinstance(gpu, str) else (gpu or "")
        return Instance(id=str(row["id"]), state=state, status=status, currency="USD",
                        price_per_hour=round(float(price), 4) if isinstance(price, (int, float)) else None,
                        label=_text(row.get("label"), 80), gpu=_text(words, 80), gpu_held=status == "frozen",
                        interruptible=row.get("is_bid") is True,
                        created_at=datetime.fromtimestamp(start, timezone.utc)
                        if isinstance(start, (int, float)) and 0 < start < 1e11 else None)

    def balance(self) -> Balance | None:
        """``GET /users/current/``: the account's ``credit`` in USD."""
        answer = self._call("GET", "/users/current/", "balance")
        credit = answer.get("credit") if isinstance(answer, dict) else None
        if not isinstance(credit, (int, float)) or isinstance(credit, bool):
            raise ProviderError(self.name, "balance", "answer has no credit")
        return Balance(amount=round(float(credit), 2), currency="USD")

    def row_state(self, row: dict[str, Any]) -> tuple[State, str]:
        return _state(row)

    def row_price(self, row: dict[str, Any]) -> object:
        return row.get("dph_total")

    def row_ssh(self, row: dict[str, Any]) -> tuple[object, object]:
        """Direct SSH where the instance has it (``public_ipaddr`` and the host port mapped
        to the container's 22, ``ports["22/tcp"][0]["HostPort"]``, as the official client's
        ``ssh-url``); vast's SSH proxy (``ssh_host``/``ssh_port``) otherwise."""
        direct = _direct_port(row.get("ports"))
        if direct is not None and row.get("public_ipaddr"):
            return row.get("public_ipaddr"), direct
        return row.get("ssh_host"), row.get("ssh_port")

    def power_on(self, instance_id: str) -> None:
        try:
            self._call("PUT", f"/instances/{instance_id}/", "start", body={"state": "running"})
        except ProviderError as exc:
            if not isinstance(exc, ProviderAuthError) and any(word in exc.message.lower() for word in _STOCK_WORDS):
                raise OutOfStock(self.name, "start", exc.message) from None
            raise

    def power_off(self, instance_id: str) -> None:
        self._call("PUT", f"/instances/{instance_id}/", "stop", body={"state": "stopped"})

    def release(self, instance_id: str) -> None:
        """``DELETE /instances/{id}/``: destroyed in any state, its disk with it."""
        self._call("DELETE", f"/instances/{instance_id}/", "destroy", body={})


def _direct_port(ports: object) -> object:
    """The host port mapped to the container's 22/tcp, or None."""
    if not isinstance(ports, dict):
        return None
    mapped = ports.get("22/tcp")
    if not (isinstance(mapped, list) and mapped and isinstance(mapped[0], dict)):
        return None
    return mapped[0].get("HostPort")


def _since(row: dict[str, Any], started: float) -> bool:
    """Whether the instance ``row`` may have been made by a request sent at ``started``."""
    start = row.get("start_date")
    return not isinstance(start, (int, float)) or start >= started - _CLOCK_SLACK_S


def _text(value: object, limit: int) -> str:
    """A provider's free text, printable and cut."""
    return "".join(ch for ch in str(value or "") if ch.isprintable())[:limit]


# The documented ``actual_status`` values (vast's show-instances page) that mean the
# instance will not come up by waiting: the container's process died, the host is gone.
_DEAD = ("exited", "offline")


def _state(row: dict[str, Any]) -> tuple[State, str]:
    """orch's word from ``actual_status`` (what runs: null while provisioning, ``created``,
    ``loading``, ``running``, ``stopped``, ``frozen``, ``exited``, ``rebooting``, ``unknown``,
    ``offline``) and ``intended_status`` (what was asked: running, stopped or frozen). The
    status is vast's word, with its ``status_msg`` where the instance failed. An
    interruptible instance (``is_bid``) stopped while it is meant to run has been outbid:
    vast pauses it until its bid is the highest again (``preempted``)."""
    actual = _text(row.get("actual_status"), 40)
    intended = _text(row.get("intended_status"), 40)
    wants_on = intended not in ("stopped", "frozen")
    if row.get("is_bid") is True and wants_on and (actual == "stopped" or (
            actual == "" and _text(row.get("cur_state"), 40) == "stopped")):
        msg = _text(row.get("status_msg"), 200)
        return "preempted", "stopped: outbid" + (f" ({msg})" if msg else "")
    if actual == "running":
        return ("running" if wants_on else "stopping"), actual
    if actual in ("", "created"):
        return ("creating" if wants_on else "off"), actual or "provisioning"
    if actual in ("loading", "rebooting"):
        return ("starting" if wants_on else "stopping"), actual
    if actual in ("stopped", "frozen"):  # frozen: paused, the GPU still billed
        return ("starting" if wants_on else "off"), actual
    if actual in _DEAD:
        if not wants_on:
            return "off", actual
        msg = _text(row.get("status_msg"), 200)
        return "failed", f"{actual}: {msg}" if msg else actual
    return "unknown", actual

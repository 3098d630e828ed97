"""A stand-in for vast.ai's REST API, built from vast's docs and its official client (the sources
are named next to each answer; docs/providers.md's vast table lists them), whose instances are
real sshd processes on loopback (``boxes.py``), one login user each, reached with the keys
attached to them.

What it serves (and nothing else: another path is 404, another method on a known path 405):
``POST /api/v0/bundles/`` (offers filtered by the official client's offer fields only, as vast
ignores others), ``PUT /api/v0/asks/{id}/`` (fields outside the official client's create body
refused), ``GET|PUT|DELETE /api/v0/instances/{id}/``, ``POST /api/v0/instances/{id}/ssh/``,
``GET /api/v1/instances/`` (paged, ``limit`` 1..25, ``next_token``), the retiring
``GET /api/v0/instances/`` and ``GET /api/v0/users/current/``. A wrong key gets HTTP 404 ``auth_error`` (issue 37's report).

A new instance is provisioning (``actual_status`` null), then ``loading``, then ``running``. An
instance rented with ``runtype`` ``ssh_direc ...`` on an offer with open ports gets direct SSH
(``public_ipaddr`` + ``ports["22/tcp"]``); every running instance also has vast's SSH proxy
(``ssh_host``/``ssh_port``): here a real TCP forwarder to its sshd that counts connections. The
ledger bills from create or start until stop or destroy at the offer's ``dph_total`` (an exited
instance still holds its GPU and bills). Test-only calls under ``/standin/`` (no key):
``ledger``; ``create_fault`` (``{"status": 502}``: the next create rents the instance and then
answers that error); ``console_create`` (``{"label": L}``: an instance rented in vast's web
console, not by orch; its id in ``created``); ``exit_on_start`` (``{"status_msg": M}``: the next
instance to start exits instead, its container's process dead, with that message); every
answer of theirs carries ``proxied`` (connections through each instance's proxy).

Interruptible instances (bids): every offer carries ``min_bid`` (USD/h for the machine;
vast-cli ``vastai/data/offer.py``, ``search offers`` help "current minimum bid price in $/hr
for interruptible"), ``type: bid`` searches are served, a create with ``price`` (the bid;
docs.vast.ai/api-reference/instances/create-instance: "Bid price per machine (in $/hour). Only
for interruptible instances", 0.001..128) rents an interruptible instance billed at its bid
(``is_bid`` true on its row, ``dph_total`` the bid: both UNVERIFIED for instance rows, whose
published schema, vast-cli ``vastai/data/instance.py`` ``Instance``, lists neither). A bid below
the offer's ``min_bid`` makes the instance anyway, stopped, and answers an error (dstack's vast
adapter: "Vast.ai creates spot instances in the stopped state and returns an error if the bid is
insufficient"; the status and words here are UNVERIFIED). ``PUT /api/v0/instances/bid_price/
{id}/`` (docs.vast.ai/api-reference/instances/change-bid: ``client_id``, ``price`` required,
0.001..32, ``{"success": true}``) changes the bid; a bid above the one that outbid the instance
starts it again. Test-only: ``outbid`` (``{"id": ID, "price": P}``: a higher bid takes the
instance's GPU: vast pauses it, its processes gone, disk kept — docs.vast.ai instance-details
"Lower priority instances are paused until they become the highest priority" — shown as
``actual_status`` ``stopped`` with ``intended_status`` still ``running``), ``min_bid_rises``
(``{"by": D}``: every offer's ``min_bid`` rises by D after the next search, as a host's ``set
min_bid`` would between a search and a create).
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

from tests.support.standin.boxes import Box, Request, StandinServer, boot, halt, later, new_box, serve, wipe, \
    write_keys

V0, V1 = "/api/v0", "/api/v1"
# Offer rows: fields as vast's offers carry them (vast-ai/vast-cli vastai/api/query.py offers_fields).
OFFERS: list[dict[str, Any]] = [
    {"id": 4101, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.412, "min_bid": 0.206, "disk_space": 250.0, "reliability": 0.995,
     "gpu_ram": 24564, "geolocation": "Norway, NO", "verified": True, "rentable": True, "rented": False,
     "external": False, "direct_port_count": 20},
    {"id": 4102, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.301, "min_bid": 0.182, "disk_space": 120.0, "reliability": 0.81,
     "gpu_ram": 24564, "geolocation": "Texas, US", "verified": True, "rentable": True, "rented": False,
     "external": False, "direct_port_count": 0},
    {"id": 4103, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.356, "min_bid": 0.151, "disk_space": 20.0, "reliability": 0.990,
     "gpu_ram": 24564, "geolocation": "Quebec, CA", "verified": True, "rentable": True, "rented": False,
     "external": False, "direct_port_count": 0},
    {"id": 4104, "gpu_name": "RTX 4090", "num_gpus": 2, "dph_total": 0.790, "min_bid": 0.402, "disk_space": 500.0, "reliability": 0.998,
     "gpu_ram": 24564, "geolocation": "Sweden, SE", "verified": True, "rentable": True, "rented": False,
     "external": False, "direct_port_count": 40},
    {"id": 4105, "gpu_name": "A100 SXM4", "num_gpus": 1, "dph_total": 1.105, "min_bid": 0.601, "disk_space": 900.0,
     "reliability": 0.997, "gpu_ram": 81920, "geolocation": "Virginia, US", "verified": True, "rentable": True,
     "rented": False, "external": False, "direct_port_count": 0},
]
# The fields vast filters offers on (vast-ai/vast-cli vastai/api/query.py offers_fields, where
# ``reliability2`` is commented out); a filter on another field is ignored, as issue 37 reports.
FILTERABLE = {"disk_space", "dph_total", "external", "gpu_name", "gpu_ram", "num_gpus", "reliability", "rentable",
              "rented", "verified", "direct_port_count", "geolocation", "id", "min_bid"}
# ``type`` values of a search (vast-cli vastai/api/offers.py search_offers: "on-demand",
# "reserved" or "bid"; the client turns "interruptible" into "bid")
SEARCH_TYPES = {"on-demand", "reserved", "bid"}
BID_RANGE, CHANGE_BID_RANGE = (0.001, 128.0), (0.001, 32.0)  # the API reference's "Required range"
# The create body's fields (vast-ai/vast-cli vastai/api/instances.py create_instance,
# vastai/data/instance.py InstanceConfig); the stand-in refuses any other.
CREATE_FIELDS = {"client_id", "image", "env", "price", "disk", "label", "extra", "onstart", "image_login",
                 "python_utf8", "lang_utf8", "use_jupyter_lab", "jupyter_dir", "force", "cancel_unavail",
                 "template_hash_id", "template_id", "user", "runtype", "args", "args_str", "volume_info",
                 "target_state"}
# runtype values the official client sends (vastai/cli/commands/instances.py get_runtype).
RUNTYPES = {"ssh", "ssh_proxy", "ssh_direc ssh_proxy", "args", "jupyter_proxy ssh_proxy",
            "jupyter_direc ssh_direc ssh_proxy"}
# A wrong or revoked key: HTTP 404 with an auth error (issue 37's report; the official client
# knows 401 "Invalid user key" and 404 "Session expired. Please log in again."): unverified body.
AUTH_ERROR = {"success": False, "error": "auth_error", "msg": "Invalid user key"}


class Forwarder:
    """vast's SSH proxy for one instance: a TCP port on 127.0.0.1 that relays to its sshd and
    counts the connections it relayed."""

    def __init__(self, target: int) -> None:
        self.target, self.count = target, 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.count += 1
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self.sock.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class VastStandin(StandinServer):
    """``start()`` serves on 127.0.0.1; instances are made by renting an offer."""

    def __init__(self, workdir: Path, token: str, boot_delay_s: float = 0.5, user_prefix: str = "orchsv") -> None:
        super().__init__(workdir, token, boot_delay_s)
        self.offers = [dict(o) for o in OFFERS]
        self.rented: dict[str, int] = {}  # instance id -> offer id
        self.meta: dict[str, dict[str, Any]] = {}  # instance id -> intended, label, direct, msg, start_date
        self.proxies: dict[str, Forwarder] = {}
        self.proxied: dict[str, int] = {}
        self.create_fault: int | None = None
        self.exit_msg: str | None = None
        self.min_bid_rise = 0.0
        self.credit = 25.0
        self.user_prefix = user_prefix
        self.ids = itertools.count(81000001)

    def next_user(self) -> str:
        """The login user of the next instance created (one per instance)."""
        return f"{self.user_prefix}{len(self.boxes)}"

    def describe(self) -> list[dict[str, Any]]:
        return [{"id": int(b.id), "actual_status": b.status, "user": b.user} for b in self.boxes.values()]

    def route(self, req: Request) -> tuple[int, Any]:
        # docs.vast.ai/api-reference/authentication: "Authorization: Bearer $VAST_API_KEY".
        if req.headers.get("Authorization") != f"Bearer {self.token}":
            return 404, AUTH_ERROR
        version, _, rest = req.path.partition("/api/")[2].partition("/")
        parts = [p for p in rest.split("/") if p] if req.path.startswith(("/api/v0/", "/api/v1/")) else []
        known: tuple[str, ...] = ()
        if version == "v1" and parts == ["instances"]:
            known = ("GET",)
            if req.method == "GET":
                return self._list_v1(req.args)
        elif version == "v0" and parts == ["bundles"]:
            known = ("POST",)
            if req.method == "POST":
                return self._search(req.args)
        elif version == "v0" and parts == ["users", "current"]:
            known = ("GET",)
            if req.method == "GET":
                # docs.vast.ai/api-reference/authentication and sdk/python/authentication: the
                # account row holds ``credit`` (the official client drops ``api_key`` from it).
                return 200, {"id": 123456, "email": "standin@example.com", "credit": self.credit}
        elif version == "v0" and len(parts) == 2 and parts[0] == "asks":
            known = ("PUT",)
            if req.method == "PUT":
                return self._create(parts[1], req.args)
        elif version == "v0" and parts == ["instances"]:
            known = ("GET",)
            if req.method == "GET":
                return self._list_v0()
        elif version == "v0" and len(parts) == 3 and parts[:2] == ["instances", "bid_price"]:
            known = ("PUT",)
            if req.method == "PUT":
                return self._change_bid(parts[2], req.args)
        elif version == "v0" and parts[:1] == ["instances"] and len(parts) in (2, 3) and parts[2:] in ([], ["ssh"]):
            known = ("GET", "PUT", "DELETE") if len(parts) == 2 else ("POST",)
            if req.method in known:
                return self._one(req, parts)
        if known:
            return 405, {"success": False, "error": "method_not_allowed", "msg": f"{req.method} not allowed here"}
        return 404, {"success": False, "error": "not_found", "msg": f"no such API {req.method} {req.path}"}

    def _one(self, req: Request, parts: list[str]) -> tuple[int, Any]:
        box = self.boxes.get(parts[1])
        if box is None or box.status == "destroyed":
            if req.method == "GET":
                # vast-ai/vast-cli vastai/api/instances.py show_instance: {"instances": null}.
                return 200, {"instances": None}
            return 404, {"success": False, "error": "no_such_instance", "msg": f"Instance {parts[1]} not found."}
        if req.method == "GET":
            if req.args.get("owner") != "me":
                return 400, {"success": False, "error": "invalid_args", "msg": "owner=me is required"}
            return 200, {"instances": self._row(box)}
        if req.method == "PUT":
            return self._set_state(box, req.args)
        if req.method == "DELETE":
            return self._destroy(box)
        return self._attach(box, req.args.get("ssh_key"))

    def _search(self, q: dict[str, Any]) -> tuple[int, Any]:
        # vast-ai/vast-cli vastai/api/offers.py search_offers: POST /bundles/ → {"offers": [...]}.
        if q.get("type", "on-demand") not in SEARCH_TYPES:
            return 400, {"success": False, "error": "invalid_args", "msg": f"unknown type {q.get('type')!r}"}
        taken = set(self.rented.values())
        rows = [dict(o) for o in self.offers if o["id"] not in taken and _matches(o, q)]
        for key, direction in reversed(q.get("order") or []):
            rows.sort(key=lambda o: o.get(key, 0), reverse=direction == "desc")
        if self.min_bid_rise:  # a host raises its minimum between this search and the create
            for offer in self.offers:
                offer["min_bid"] = round(offer["min_bid"] + self.min_bid_rise, 4)
            self.min_bid_rise = 0.0
        return 200, {"offers": rows[: int(q.get("limit") or 64)]}

    def _create(self, offer_id: str, args: dict[str, Any]) -> tuple[int, Any]:
        # vast-ai/vast-cli vastai/data/instance.py CreateInstanceResponse: {"success", "new_contract"}.
        unknown = sorted(set(args) - CREATE_FIELDS)
        if unknown:
            return 400, {"success": False, "error": "invalid_args", "msg": f"unknown fields: {', '.join(unknown)}"}
        offer = next((o for o in self.offers if str(o["id"]) == offer_id), None)
        if offer is None or offer["id"] in self.rented.values():
            return 400, {"success": False, "error": "no_such_ask", "msg": f"Offer {offer_id} is no longer available."}
        if not isinstance(args.get("image"), str) or not isinstance(args.get("disk"), (int, float)):
            return 400, {"success": False, "error": "invalid_args", "msg": "image and disk are required"}
        runtype = args.get("runtype", "ssh")
        if runtype not in RUNTYPES:
            return 400, {"success": False, "error": "invalid_args", "msg": f"unknown runtype {runtype!r}"}
        direct = "ssh_direc" in str(runtype) and offer.get("direct_port_count", 0) > 0
        bid = args.get("price")
        if bid is not None:
            if not isinstance(bid, (int, float)) or isinstance(bid, bool) or not BID_RANGE[0] <= bid <= BID_RANGE[1]:
                return 400, {"success": False, "error": "invalid_args",
                             "msg": f"price must be {BID_RANGE[0]:g} to {BID_RANGE[1]:g}"}
            if bid < offer["min_bid"]:  # made anyway, stopped (dstack); words and status UNVERIFIED
                box = self._rent(offer, str(args.get("label") or ""), direct, bid=float(bid), start=False)
                return 400, {"success": False, "error": "bid_too_low", "new_contract": int(box.id),
                             "msg": f"Your bid of ${bid:.3f}/hr is below the minimum bid of "
                                    f"${offer['min_bid']:.3f}/hr for this offer."}
        box = self._rent(offer, str(args.get("label") or ""), direct, bid=None if bid is None else float(bid))
        if self.create_fault is not None:
            status, self.create_fault = self.create_fault, None
            return status, {"success": False, "error": "server_error", "msg": "upstream timed out (stand-in fault)"}
        return 200, {"success": True, "new_contract": int(box.id)}

    def _rent(self, offer: dict[str, Any], label: str, direct: bool, bid: float | None = None,
              start: bool = True) -> Box:
        box = new_box(self.workdir, str(next(self.ids)), self.next_user(), "provisioning" if start else "off",
                      float(offer["dph_total"] if bid is None else bid), password=False)
        wipe(box)  # a new instance starts with an empty disk
        self.boxes[box.id] = box
        self.rented[box.id] = offer["id"]
        self.meta[box.id] = {"intended": "running" if start else "stopped", "label": label, "direct": direct,
                             "msg": "", "start_date": time.time(), "gpu_name": offer["gpu_name"],
                             "num_gpus": offer["num_gpus"], "bid": bid, "outbid_by": None}
        if start:
            self._start(box)
        return box

    def _start(self, box: Box) -> None:
        with box.lock:
            box.status, box.since = ("provisioning" if box.powered_on == 0 else "loading"), time.time()
            self.meta[box.id]["intended"], self.meta[box.id]["msg"] = "running", ""
        later(self.boot_delay_s, self._boot, box)

    def _boot(self, box: Box) -> None:
        with box.lock:
            if box.status not in ("provisioning", "loading"):
                return
            if self.exit_msg is not None:  # the container's process died while it started
                self.meta[box.id]["msg"], self.exit_msg = self.exit_msg, None
                box.status = "exited"
                return
            boot(box, new_password=False)
            serve(box)
            self.proxies[box.id] = Forwarder(box.port)
            box.status = "running"

    def _row(self, box: Box) -> dict[str, Any]:
        """One instance as vast's show-instance answers it (vast-ai/vast-cli vastai/data/instance.py
        Instance; the states of docs.vast.ai/sdk/python/reference/show-instance)."""
        meta, on = self.meta[box.id], box.status == "running"
        actual = {"provisioning": None, "stopping": "running", "off": "stopped", "outbid": "stopped"}.get(
            box.status, box.status)
        proxy = self.proxies.get(box.id)
        return {"id": int(box.id), "actual_status": actual, "intended_status": meta["intended"],
                "cur_state": "stopped" if box.status in ("off", "outbid") else "running", "dph_total": box.price,
                "is_bid": meta["bid"] is not None,
                "label": meta["label"] or None, "gpu_name": meta["gpu_name"], "num_gpus": meta["num_gpus"],
                "start_date": meta["start_date"], "status_msg": meta["msg"] or None,
                "image_runtype": "ssh_direc ssh_proxy" if meta["direct"] else "ssh_proxy",
                "ssh_host": "127.0.0.1" if on and proxy else None, "ssh_port": proxy.port if on and proxy else None,
                "public_ipaddr": "127.0.0.1",
                # vast-ai/vast-cli vastai/cli/commands/misc.py ssh-url: ports["22/tcp"][0]["HostPort"].
                "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": str(box.port)}]} if on and meta["direct"]
                else {}, "extra_env": []}

    def _list_v1(self, args: dict[str, Any]) -> tuple[int, Any]:
        """vast-ai/vast-cli vastai/api/instances.py show_instances_v1: query args JSON-encoded
        (``select_filters``, ``order_by``, ``limit`` 1..25 per docs.vast.ai/cli/reference/
        show-instances-v1, ``after_token``); the answer ``instances``, ``next_token``,
        ``total_instances``."""
        try:
            filters = json.loads(args.get("select_filters", "{}"))
            limit = int(json.loads(args.get("limit", "25")))
        except (ValueError, TypeError):
            return 400, {"success": False, "error": "invalid_args", "msg": "select_filters and limit must be JSON"}
        if not isinstance(filters, dict) or not 1 <= limit <= 25:
            return 400, {"success": False, "error": "invalid_args", "msg": "limit must be 1..25"}
        rows = [self._row(b) for b in sorted(self.boxes.values(), key=lambda b: int(b.id)) if b.status != "destroyed"]
        rows = [r for r in rows if _matches(r, {k: v for k, v in filters.items() if k in ("id", "label")})]
        after = int(args.get("after_token") or 0)
        page = [r for r in rows if r["id"] > after][:limit]
        more = len([r for r in rows if r["id"] > after]) > limit
        return 200, {"instances": page, "next_token": str(page[-1]["id"]) if more else None,
                     "total_instances": len(rows)}

    def _list_v0(self) -> tuple[int, Any]:
        """The retiring list (vast.ai/developers/api: GET /api/v0/instances/)."""
        return 200, {"instances": [self._row(b) for b in self.boxes.values() if b.status != "destroyed"]}

    def _set_state(self, box: Box, args: dict[str, Any]) -> tuple[int, Any]:
        # vast-ai/vast-cli vastai/api/instances.py start_instance/stop_instance: {"state": ...}.
        state = args.get("state")
        if box.status == "outbid" and state in ("stopped", "running"):  # paused: it waits, or is now meant off
            with box.lock:
                self.meta[box.id]["intended"] = state
                box.status = "off" if state == "stopped" else box.status
            return 200, {"success": True}
        if state == "stopped":
            with box.lock:
                if box.status not in ("running", "loading", "provisioning", "exited"):
                    return 400, {"success": False, "error": "invalid_state", "msg": f"Instance is {box.status}."}
                box.status, self.meta[box.id]["intended"] = "stopping", "stopped"
            later(self.boot_delay_s, self._halt, box)
            return 200, {"success": True}
        if state == "running":
            if box.status not in ("off", "exited"):
                return 400, {"success": False, "error": "invalid_state", "msg": f"Instance is {box.status}."}
            with box.lock:
                halt(box, new_password=False)
            self._start(box)
            return 200, {"success": True}
        return 400, {"success": False, "error": "invalid_args", "msg": f"unknown state {state!r}"}

    def _change_bid(self, instance_id: str, args: dict[str, Any]) -> tuple[int, Any]:
        """docs.vast.ai/api-reference/instances/change-bid: ``client_id`` and ``price`` required
        (0.001..32), ``{"success": true}``; a bid above the one that outbid the instance wins
        its GPU back (it starts). On an on-demand instance: refused (UNVERIFIED words)."""
        box = self.boxes.get(instance_id)
        if box is None or box.status == "destroyed":
            return 404, {"success": False, "error": "no_such_instance", "msg": f"Instance {instance_id} not found."}
        price = args.get("price")
        if args.get("client_id") != "me" or not isinstance(price, (int, float)) or isinstance(price, bool) \
                or not CHANGE_BID_RANGE[0] <= price <= CHANGE_BID_RANGE[1]:
            return 400, {"success": False, "error": "invalid_args",
                         "msg": f"client_id and price ({CHANGE_BID_RANGE[0]:g} to {CHANGE_BID_RANGE[1]:g}) are required"}
        meta = self.meta[box.id]
        if meta["bid"] is None:
            return 400, {"success": False, "error": "invalid_args", "msg": "Instance is not an interruptible instance."}
        meta["bid"], box.price = float(price), float(price)
        if box.status == "outbid" and price > (meta["outbid_by"] or 0) and meta["intended"] == "running":
            meta["outbid_by"] = None
            with box.lock:
                halt(box, new_password=False)
            self._start(box)
        return 200, {"success": True}

    def _outbid(self, box: Box, price: float | None) -> dict[str, Any]:
        """A higher bid takes the instance's GPU: its processes end, its disk stays, it waits."""
        meta = self.meta[box.id]
        if meta["bid"] is None or box.status != "running":
            return {"error": f"instance {box.id} is not a running interruptible instance"}
        with box.lock:
            self._stop_proxy(box)
            halt(box, new_password=False)
            box.status = "outbid"
        meta["outbid_by"] = price if price is not None else round(meta["bid"] + 0.01, 4)
        return {"outbid": box.id}

    def _stop_proxy(self, box: Box) -> None:
        proxy = self.proxies.pop(box.id, None)
        if proxy is not None:
            self.proxied[box.id] = self.proxied.get(box.id, 0) + proxy.count
            proxy.close()

    def _halt(self, box: Box) -> None:
        with box.lock:
            self._stop_proxy(box)
            halt(box, new_password=False)
            box.status = "off"

    def _destroy(self, box: Box) -> tuple[int, Any]:
        # docs.vast.ai/api-reference/instances/destroy-instance: {"success": true, "msg": ...}.
        with box.lock:
            self._stop_proxy(box)
            halt(box, new_password=False)
            wipe(box)
            box.status = "destroyed"
        self.rented.pop(box.id, None)
        return 200, {"success": True, "msg": "Instance destroyed successfully"}

    def _attach(self, box: Box, key: object) -> tuple[int, Any]:
        # vast-ai/vast-cli vastai/api/keys.py attach_ssh: POST /instances/{id}/ssh/ {"ssh_key"}.
        if not isinstance(key, str) or not key.startswith(("ssh-", "ecdsa-")):
            return 400, {"success": False, "error": "invalid_args", "msg": "ssh_key is not an OpenSSH public key"}
        with box.lock:
            box.keys.append(key)
            write_keys(box)
        return 200, {"success": True, "msg": "SSH key attached."}

    def admin(self, action: str, args: dict[str, Any]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        if action == "create_fault":
            self.create_fault = int(args.get("status", 502))
        elif action == "console_create":
            taken = set(self.rented.values())
            offer = next((o for o in self.offers if o["id"] not in taken), None)
            if offer is None:
                found["error"] = "every offer is rented: destroy an instance first"
            else:
                found["created"] = self._rent(offer, str(args.get("label", "from the web console")), False).id
        elif action == "outbid":
            box = self.boxes.get(str(args.get("id")))
            found.update(self._outbid(box, args.get("price")) if box is not None else {"error": "no such instance"})
        elif action == "min_bid_rises":
            self.min_bid_rise = float(args.get("by", 0.1))
        elif action == "exit_on_start":
            self.exit_msg = str(args.get("status_msg", "Error response from daemon: container exited (stand-in)"))
        counts = {**self.proxied}
        for box_id, proxy in self.proxies.items():
            counts[box_id] = counts.get(box_id, 0) + proxy.count
        return {**found, "billing": self.billing(), "proxied": counts}

    def stop(self) -> None:
        for proxy in list(self.proxies.values()):
            proxy.close()
        super().stop()


def _matches(offer: dict[str, Any], q: dict[str, Any]) -> bool:
    """vast's filter operators (``eq``, ``gte``, ``lte``) on one row; a field outside
    ``FILTERABLE`` is ignored, as vast ignores it."""
    for field_name, cond in q.items():
        if not isinstance(cond, dict) or field_name not in FILTERABLE or field_name not in offer:
            continue
        value = offer[field_name]
        for op, want in cond.items():
            if op == "eq" and value != want or op == "gte" and value < want or op == "lte" and value > want:
                return False
    return True

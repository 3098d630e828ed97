"""A stand-in for vast.ai's REST API (the paths, fields and errors
``orchestrator/providers/vast.py`` uses), whose instances are real sshd processes on loopback
(``boxes.py``), one login user each, reached with the keys attached to them.

Offers are a fixed list, filtered by the query's ``eq``/``gte``/``lte`` the way vast filters
them; renting one takes it off the market until the instance is destroyed. A new instance is
``loading`` before it runs; ``ssh_host``/``ssh_port`` appear once sshd runs, on a new port at
every start. The ledger bills running seconds at the offer's ``dph_total`` (a stopped
instance's storage is not billed here). A wrong key gets HTTP 401. Test-only calls under
``/standin/`` (no key): ``ledger``, ``create_fault`` (``{"status": 502}``: the next create rents
the instance and then answers that error, the ambiguous failure).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

from tests.support.standin.boxes import Box, Request, StandinServer, boot, halt, later, new_box, serve, wipe, \
    write_keys

PREFIX = "/api/v0"
OFFERS: list[dict[str, Any]] = [
    {"id": 4101, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.412, "disk_space": 250.0,
     "reliability2": 0.995, "gpu_ram": 24564, "geolocation": "Norway, NO", "verified": True, "rentable": True},
    {"id": 4102, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.301, "disk_space": 120.0,
     "reliability2": 0.81, "gpu_ram": 24564, "geolocation": "Texas, US", "verified": True, "rentable": True},
    {"id": 4103, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.356, "disk_space": 20.0,
     "reliability2": 0.990, "gpu_ram": 24564, "geolocation": "Quebec, CA", "verified": True, "rentable": True},
    {"id": 4104, "gpu_name": "RTX 4090", "num_gpus": 2, "dph_total": 0.790, "disk_space": 500.0,
     "reliability2": 0.998, "gpu_ram": 24564, "geolocation": "Sweden, SE", "verified": True, "rentable": True},
    {"id": 4105, "gpu_name": "A100 SXM4", "num_gpus": 1, "dph_total": 1.105, "disk_space": 900.0,
     "reliability2": 0.997, "gpu_ram": 81920, "geolocation": "Virginia, US", "verified": True, "rentable": True},
]


class VastStandin(StandinServer):
    """``start()`` serves on 127.0.0.1; instances are made by renting an offer."""

    def __init__(self, workdir: Path, token: str, boot_delay_s: float = 0.5, user_prefix: str = "orchsv") -> None:
        super().__init__(workdir, token, boot_delay_s)
        self.offers = [dict(o) for o in OFFERS]
        self.rented: dict[str, int] = {}  # instance id -> offer id
        self.create_fault: int | None = None
        self.user_prefix = user_prefix
        self.ids = itertools.count(81000001)

    def next_user(self) -> str:
        """The login user of the next instance created (one per instance)."""
        return f"{self.user_prefix}{len(self.boxes)}"

    def describe(self) -> list[dict[str, Any]]:
        return [{"id": int(b.id), "actual_status": b.status, "user": b.user} for b in self.boxes.values()]

    def route(self, req: Request) -> tuple[int, Any]:
        if req.headers.get("Authorization") != f"Bearer {self.token}":
            return 401, {"success": False, "error": "invalid_user_key", "msg": "Invalid user key (vast stand-in)"}
        path = req.path.removeprefix(PREFIX) if req.path.startswith(PREFIX + "/") else ""
        parts = [p for p in path.split("/") if p]
        if req.method == "POST" and parts == ["bundles"]:
            return self._search(req.args)
        if req.method == "PUT" and len(parts) == 2 and parts[0] == "asks":
            return self._create(parts[1], req.args)
        if parts[:1] == ["instances"] and len(parts) >= 2:
            box = self.boxes.get(parts[1])
            if box is None or box.status == "destroyed":
                if req.method == "GET" and len(parts) == 2:
                    return 200, {"instances": None}
                return 404, {"success": False, "error": "no_such_instance", "msg": f"Instance {parts[1]} not found."}
            if req.method == "GET" and len(parts) == 2:
                return 200, {"instances": self._row(box)}
            if req.method == "PUT" and len(parts) == 2:
                return self._set_state(box, req.args.get("state"))
            if req.method == "DELETE" and len(parts) == 2:
                return self._destroy(box)
            if req.method == "POST" and parts[2:] == ["ssh"]:
                return self._attach(box, req.args.get("ssh_key"))
        return 404, {"success": False, "error": "not_found", "msg": f"no such API {req.method} {req.path}"}

    def _search(self, q: dict[str, Any]) -> tuple[int, Any]:
        taken = set(self.rented.values())
        rows = [o for o in self.offers if o["id"] not in taken and _matches(o, q)]
        for key, direction in reversed(q.get("order") or []):
            rows.sort(key=lambda o: o.get(key, 0), reverse=direction == "desc")
        return 200, {"offers": rows[: int(q.get("limit") or 64)]}

    def _create(self, offer_id: str, args: dict[str, Any]) -> tuple[int, Any]:
        offer = next((o for o in self.offers if str(o["id"]) == offer_id), None)
        if offer is None or offer["id"] in self.rented.values():
            return 400, {"success": False, "error": "no_such_ask", "msg": f"Offer {offer_id} is no longer available."}
        if not isinstance(args.get("image"), str) or not isinstance(args.get("disk"), (int, float)):
            return 400, {"success": False, "error": "invalid_args", "msg": "image and disk are required"}
        box = new_box(self.workdir, str(next(self.ids)), self.next_user(), "loading", float(offer["dph_total"]),
                      password=False)
        wipe(box)  # a new instance starts with an empty disk
        self.boxes[box.id] = box
        self.rented[box.id] = offer["id"]
        self._start(box)
        if self.create_fault is not None:
            status, self.create_fault = self.create_fault, None
            return status, {"success": False, "error": "server_error", "msg": "upstream timed out (stand-in fault)"}
        return 200, {"success": True, "new_contract": int(box.id)}

    def _start(self, box: Box) -> None:
        with box.lock:
            box.status, box.since = "loading", time.time()
        later(self.boot_delay_s, self._boot, box)

    def _boot(self, box: Box) -> None:
        with box.lock:
            if box.status != "loading":
                return
            boot(box, new_password=False)
            serve(box)
            box.status = "running"

    def _row(self, box: Box) -> dict[str, Any]:
        on = box.status == "running"
        return {"id": int(box.id), "actual_status": box.status if box.status != "stopping" else "running",
                "intended_status": "stopped" if box.status in ("stopping", "exited") else "running",
                "cur_state": box.status, "dph_total": box.price, "ssh_host": "127.0.0.1" if on else None,
                "ssh_port": box.port if on else None, "status_msg": f"stand-in: {box.status}",
                "label": "", "gpu_name": "stand-in"}

    def _set_state(self, box: Box, state: object) -> tuple[int, Any]:
        if state == "stopped":
            with box.lock:
                if box.status not in ("running", "loading"):
                    return 400, {"success": False, "error": "invalid_state", "msg": f"Instance is {box.status}."}
                box.status = "stopping"
            later(self.boot_delay_s, self._halt, box)
            return 200, {"success": True}
        if state == "running":
            if box.status != "exited":
                return 400, {"success": False, "error": "invalid_state", "msg": f"Instance is {box.status}."}
            self._start(box)
            return 200, {"success": True}
        return 400, {"success": False, "error": "invalid_args", "msg": f"unknown state {state!r}"}

    def _halt(self, box: Box) -> None:
        with box.lock:
            halt(box, new_password=False)
            box.status = "exited"

    def _destroy(self, box: Box) -> tuple[int, Any]:
        with box.lock:
            halt(box, new_password=False)
            wipe(box)
            box.status = "destroyed"
        self.rented.pop(box.id, None)
        return 200, {"success": True}

    def _attach(self, box: Box, key: object) -> tuple[int, Any]:
        if not isinstance(key, str) or not key.startswith(("ssh-", "ecdsa-")):
            return 400, {"success": False, "error": "invalid_args", "msg": "ssh_key is not an OpenSSH public key"}
        with box.lock:
            box.keys.append(key)
            write_keys(box)
        return 200, {"success": True, "msg": "SSH key attached."}

    def admin(self, action: str, args: dict[str, Any]) -> dict[str, Any]:
        if action == "create_fault":
            self.create_fault = int(args.get("status", 502))
        return {"billing": self.billing()}


def _matches(offer: dict[str, Any], q: dict[str, Any]) -> bool:
    """vast's filter operators on one offer row (fields it does not hold pass, like vast's
    defaults on fields this stand-in does not model)."""
    for field_name, cond in q.items():
        if not isinstance(cond, dict) or field_name not in offer:
            continue
        value = offer[field_name]
        for op, want in cond.items():
            if op == "eq" and value != want or op == "gte" and value < want or op == "lte" and value > want:
                return False
    return True

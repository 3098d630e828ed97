"""A stand-in for RunPod's REST API (``/v1/pods``) and the GraphQL ``gpuTypes`` prices (the
paths, fields and errors ``orchestrator/providers/runpod.py`` uses), whose pods are real sshd
processes on loopback (``boxes.py``), one login user each, reached with the key in the pod's
``PUBLIC_KEY``.

A new or started pod is ``RUNNING`` before its ``publicIp``/``portMappings`` appear (sshd on a
new port at every start); a stopped pod is ``EXITED``; a deleted one is unknown (404). The
ledger bills running seconds at the pod's ``costPerHr`` (the GPU type's price times the count;
a stopped pod's volume is not billed here, and its container disk is not wiped). A wrong key
gets HTTP 401. Test-only calls under ``/standin/`` (no key): ``ledger``, ``stock``
(``{"refusals": N}``: that many starts refused for want of free GPUs).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

from tests.support.standin.boxes import Box, Request, StandinServer, boot, halt, later, new_box, serve, wipe

GPU_TYPES: list[dict[str, Any]] = [
    {"id": "NVIDIA GeForce RTX 4090", "displayName": "RTX 4090", "memoryInGb": 24, "secureCloud": True,
     "communityCloud": True, "prices": {"secure": 0.69, "community": 0.34}},
    {"id": "NVIDIA A100 80GB PCIe", "displayName": "A100 PCIe", "memoryInGb": 80, "secureCloud": True,
     "communityCloud": False, "prices": {"secure": 1.64, "community": None}},
    {"id": "NVIDIA H100 80GB HBM3", "displayName": "H100 SXM", "memoryInGb": 80, "secureCloud": True,
     "communityCloud": True, "prices": {"secure": None, "community": None}},  # no stock anywhere
]


class RunPodStandin(StandinServer):
    """``start()`` serves on 127.0.0.1: REST under ``/v1``, GraphQL at ``/graphql``."""

    def __init__(self, workdir: Path, token: str, boot_delay_s: float = 0.5, user_prefix: str = "orchsr") -> None:
        super().__init__(workdir, token, boot_delay_s)
        self.out_of_stock = 0
        self.pods: dict[str, dict[str, Any]] = {}  # what create was asked, per pod id
        self.user_prefix = user_prefix

    def next_user(self) -> str:
        """The login user of the next instance created (one per instance)."""
        return f"{self.user_prefix}{len(self.boxes)}"

    def describe(self) -> list[dict[str, Any]]:
        return [{"id": b.id, "desiredStatus": b.status, "user": b.user} for b in self.boxes.values()]

    def route(self, req: Request) -> tuple[int, Any]:
        if req.headers.get("Authorization") != f"Bearer {self.token}":
            if req.path == "/graphql":
                return 401, {"errors": [{"message": "Unauthorized: invalid api key (runpod stand-in)"}]}
            return 401, {"error": "Unauthorized: invalid api key (runpod stand-in)", "status": 401}
        if req.path == "/graphql" and req.method == "POST":
            return self._graphql(req.args)
        parts = [p for p in req.path.split("/") if p]
        if parts[:2] != ["v1", "pods"]:
            return 404, {"error": f"no such API {req.method} {req.path}", "status": 404}
        if len(parts) == 2 and req.method == "POST":
            return self._create(req.args)
        box = self.boxes.get(parts[2]) if len(parts) >= 3 else None
        if box is None or box.status == "TERMINATED":
            return 404, {"error": "pod not found", "status": 404}
        if len(parts) == 3 and req.method == "GET":
            return 200, self._pod(box)
        if len(parts) == 3 and req.method == "DELETE":
            return self._delete(box)
        if parts[3:] == ["stop"] and req.method == "POST":
            return self._stop(box)
        if parts[3:] == ["start"] and req.method == "POST":
            return self._start(box)
        return 404, {"error": f"no such API {req.method} {req.path}", "status": 404}

    def _graphql(self, args: dict[str, Any]) -> tuple[int, Any]:
        query, variables = args.get("query"), args.get("variables") or {}
        if not isinstance(query, str) or "gpuTypes" not in query:
            return 200, {"errors": [{"message": "stand-in: only the gpuTypes prices query is served"}]}
        n = int(variables.get("n") or 1)
        rows = []
        for gpu in GPU_TYPES:
            row = {k: v for k, v in gpu.items() if k != "prices"}
            for cloud in ("secure", "community"):
                each = gpu["prices"][cloud]
                row[cloud] = None if each is None or n > 8 else {
                    "uninterruptablePrice": each, "stockStatus": "High" if n == 1 else "Low"}
            rows.append(row)
        return 200, {"data": {"gpuTypes": rows}}

    def _create(self, body: dict[str, Any]) -> tuple[int, Any]:
        types = body.get("gpuTypeIds")
        gpu = next((g for g in GPU_TYPES if isinstance(types, list) and g["id"] in types), None)
        key = (body.get("env") or {}).get("PUBLIC_KEY")
        if gpu is None or not isinstance(body.get("imageName"), str) or "22/tcp" not in (body.get("ports") or []):
            return 400, {"error": "create pod: gpuTypeIds, imageName and ports 22/tcp are required", "status": 400}
        cloud = str(body.get("cloudType") or "SECURE").lower()
        each = gpu["prices"].get(cloud)
        if each is None:
            return 400, {"error": "There are no longer any instances available with the requested specifications.",
                         "status": 400}
        count = int(body.get("gpuCount") or 1)
        box = new_box(self.workdir, secrets.token_hex(7), self.next_user(), "RUNNING", round(each * count, 4),
                      password=False)
        wipe(box)
        if isinstance(key, str) and key.startswith(("ssh-", "ecdsa-")):
            box.keys.append(key)
        self.boxes[box.id] = box
        self.pods[box.id] = dict(body)
        self._boot_later(box)
        return 201, self._pod(box)

    def _boot_later(self, box: Box) -> None:
        with box.lock:
            box.status, box.since, box.port = "RUNNING", time.time(), 0
        later(self.boot_delay_s, self._boot, box)

    def _boot(self, box: Box) -> None:
        with box.lock:
            if box.status != "RUNNING" or box.sshd is not None:
                return
            boot(box, new_password=False)
            serve(box)

    def _pod(self, box: Box) -> dict[str, Any]:
        up = box.sshd is not None
        asked = self.pods.get(box.id, {})
        return {"id": box.id, "name": asked.get("name"), "desiredStatus": box.status, "costPerHr": box.price,
                "adjustedCostPerHr": box.price, "gpuCount": asked.get("gpuCount", 1),
                "image": asked.get("imageName"), "publicIp": "127.0.0.1" if up else None,
                "portMappings": {"22": box.port} if up else {}, "ports": asked.get("ports", [])}

    def _stop(self, box: Box) -> tuple[int, Any]:
        with box.lock:
            if box.status != "RUNNING":
                return 400, {"error": f"pod is {box.status}", "status": 400}
            halt(box, new_password=False)
            box.status = "EXITED"
        return 200, self._pod(box)

    def _start(self, box: Box) -> tuple[int, Any]:
        if box.status != "EXITED":
            return 400, {"error": f"pod is {box.status}", "status": 400}
        if self.out_of_stock > 0:
            self.out_of_stock -= 1
            return 400, {"error": "There are not enough free GPUs on the host machine to start this pod.",
                         "status": 400}
        self._boot_later(box)
        return 200, self._pod(box)

    def _delete(self, box: Box) -> tuple[int, Any]:
        with box.lock:
            halt(box, new_password=False)
            wipe(box)
            box.status = "TERMINATED"
        return 204, None

    def admin(self, action: str, args: dict[str, Any]) -> dict[str, Any]:
        if action == "stock":
            self.out_of_stock = int(args.get("refusals", 0))
        return {"billing": self.billing()}

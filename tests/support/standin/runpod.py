"""A stand-in for RunPod's REST API v2 (``/v2``: the catalog, pods and their actions) and the one
GraphQL query orch sends (``myself { clientBalance }``), whose pods are real sshd processes on
loopback (``boxes.py``), one login user each, reached with the key in the pod's ``PUBLIC_KEY``.

Sources, cited per answer below as [S] (RunPod's v2 OpenAPI schema,
github.com/runpod/docs ``api-reference-v2/openapi.json``, the same file RunPod serves at
``https://api.runpod.io/v2/openapi.json``), [M] (docs.runpod.io "Migrate from API v1",
``api-reference-v2/migrate-from-v1.mdx``), [K] (RunPod's ``runpod-migrate`` skill,
github.com/runpod/runpod-plugins-official ``plugins/runpod/skills/runpod-migrate/reference/
breaking-changes.md``, "checked against the live API") and [C] (runpodctl
``internal/api/gpu.go`` ``GetUser``: GraphQL ``myself { clientBalance }``).

A new pod is ``PROVISIONING`` until its sshd runs (a new port at every start), then
``RUNNING`` with ``ssh.direct`` and ``runtime.ports``; a stopped pod is ``EXITED`` (cost 0); a
deleted one is gone from the list and 404. The ledger bills from create (or start) to stop or
delete at the pod's ``cost`` (the catalog's per-GPU price times the count). Request bodies are
checked as RunPod's schema says (``unevaluatedProperties: false``: an unknown field is a 422
naming it). Test-only calls under ``/standin/`` (no key): ``ledger``, ``stock``
(``{"refusals": N}``: that many starts refused for want of free GPUs), ``create_fault``
(``{"status": 500}``: the next create makes the pod and then answers that error, the ambiguous
failure), ``fail_boots`` (``{"count": N}``: that many starts end with the container failed,
``ERROR``, no sshd: [S] PodStatus "unrecoverable error state").

Spot pods, through GraphQL (REST v2 has none: [S] CreatePodRequest has no such field and refuses
unknown ones): ``gpuTypes { id lowestPrice(input: {gpuCount, secureCloud}) { gpuTypeId
minimumBidPrice uninterruptablePrice } }`` ([R] runpodctl ``api/cloud.go`` ``GetCloud``;
runpod-python ``api/queries/gpus.py``: the least bid per GPU, null where the GPU is not rented
interruptible — runpodctl shows "Reserved" then); ``podRentInterruptable(input:
PodRentInterruptableInput)`` ([P] SkyPilot ``sky/provision/runpod/api/pods.py``, citing
graphql-spec.runpod.io ``PodRentInterruptableInput``, and dstack's runpod ``api_client.py``: its
fields, ``bidPerGpu`` required) makes a pod billed at ``bidPerGpu`` times the count, read through
REST like any other; a bid under the least one is refused with a GraphQL error (its words
UNVERIFIED); ``pod(input: {podId}) { id podType desiredStatus }`` ([D] dstack's runpod
``_generate_pod_query``: ``podType``, ``desiredStatus``) says ``INTERRUPTABLE`` for a spot pod
(``RESERVED`` otherwise: UNVERIFIED) and ``desiredStatus`` ``RUNNING`` until it is stopped
(``EXITED``). Test-only: ``preempt`` (``{"id": POD}``: RunPod takes a running spot pod's
machine: its processes end, REST says ``EXITED``, ``desiredStatus`` stays ``RUNNING`` — what
RunPod reports for an interrupted pod is UNVERIFIED), ``min_bid_rises`` (``{"by": D}``: the next
create finds the least bid D per GPU higher than the search said, as the market moves between them).
"""

from __future__ import annotations

import re
import secrets
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tests.support.standin.boxes import Box, Request, StandinServer, boot, halt, later, new_box, serve, wipe

# One catalog row per GPU type, in [S] GpuType's shape (``price`` per GPU per hour, per cloud;
# ``secure``/``community``: offered in that cloud); ``stock`` is the stand-in's own: the
# availability [S] AvailabilityLevel it reports per cloud, NONE where it has none.
GPU_TYPES: list[dict[str, Any]] = [
    {"id": "NVIDIA GeForce RTX 4090", "name": "RTX 4090", "pool": "ADA_24", "manufacturer": "NVIDIA",
     "memory": 24, "secure": True, "community": True, "price": {"secure": 0.69, "community": 0.34},
     "maxCount": {"secure": 8, "community": 4}, "stock": {"secure": "HIGH", "community": "LOW"},
     "spot": {"secure": 0.44, "community": 0.2}},
    {"id": "NVIDIA A100 80GB PCIe", "name": "A100 PCIe", "pool": "AMPERE_80", "manufacturer": "NVIDIA",
     "memory": 80, "secure": True, "community": False, "price": {"secure": 1.64, "community": 0},
     "maxCount": {"secure": 8, "community": 0}, "stock": {"secure": "MEDIUM", "community": "NONE"},
     "spot": {"secure": None, "community": None}},  # not rented interruptible: runpodctl's "Reserved"
    {"id": "NVIDIA H100 80GB HBM3", "name": "H100 SXM", "pool": "HOPPER_141", "manufacturer": "NVIDIA",
     "memory": 80, "secure": True, "community": True, "price": {"secure": 2.69, "community": 2.39},
     "maxCount": {"secure": 8, "community": 8}, "stock": {"secure": "NONE", "community": "NONE"},  # none anywhere
     "spot": {"secure": 1.5, "community": 1.2}},
]
DATA_CENTER = {"id": "US-KS-2", "name": "US Kansas 2"}  # [S] the examples' data center
# [K] "Reading a 422" / Class 3: the capacity refusal's words, as observed live
NO_CAPACITY = "There are no longer any instances available with the requested specifications. Please refresh and try again."
# [S] CreatePodRequest (with ContainerConfig and BaseContainerConfig): every property it has
CREATE_FIELDS = {"args", "disk", "env", "image", "ports", "registry", "name", "cloud", "cpu", "dataCenterIds",
                 "globalNetworking", "gpu", "mounts", "startJupyter", "startSsh", "templateId"}
GPU_FIELDS = {"id", "count", "allowedCudaVersions", "minCudaVersion"}  # [S] CreateGpuConfig
# [S] podAction's description: which actions each status allows
# [P] PodRentInterruptableInput's fields as SkyPilot and dstack send them (the required ones first)
SPOT_REQUIRED = {"bidPerGpu", "gpuTypeId", "imageName", "name"}
SPOT_FIELDS = SPOT_REQUIRED | {
    "cloudType", "gpuCount", "volumeInGb", "containerDiskInGb", "minVcpuCount", "minMemoryInGb", "dockerArgs",
    "ports", "volumeMountPath", "env", "startSsh", "startJupyter", "supportPublicIp", "templateId",
    "networkVolumeId", "dataCenterId", "countryCode", "allowedCudaVersions", "minCudaVersion", "cudaVersion",
    "minDownload", "minUpload", "terminateAfter", "stopAfter", "volumeKey", "containerRegistryAuthId"}
ACTIONS = {"PROVISIONING": ["stop", "terminate"], "STARTING": ["stop", "terminate"],
           "RUNNING": ["stop", "restart", "terminate"], "EXITED": ["start", "terminate"],
           "ERROR": ["start", "terminate"]}


def problem(status: int, title: str, detail: str, errors: list[str] | None = None) -> tuple[int, Any]:
    """[S] ErrorResponse / [M] "RFC 9457 error objects": ``title``, ``status``, ``detail``,
    ``errors`` (validation failures) when there are any."""
    return status, {"title": title, "status": status, "detail": detail, **({"errors": errors} if errors else {})}


def invalid(errors: list[str]) -> tuple[int, Any]:
    """[S] UnprocessableEntityError; the ``errors`` wording as [K] "Class 1" quotes the live API
    (``$: additional properties 'X' not allowed``, ``$: missing property 'X'``; a nested field's
    path, ``$.gpu``, is the stand-in's own guess)."""
    return problem(422, "Unprocessable Entity", "Request validation failed.", errors)


class RunPodStandin(StandinServer):
    """``start()`` serves on 127.0.0.1: REST under ``/v2``, GraphQL at ``/graphql``."""

    def __init__(self, workdir: Path, token: str, boot_delay_s: float = 0.5, user_prefix: str = "orchsr",
                 balance: float = 25.5) -> None:
        super().__init__(workdir, token, boot_delay_s)
        self.out_of_stock = 0
        self.create_fault: int | None = None
        self.fail_boots = 0
        self.balance = balance
        self.pods: dict[str, dict[str, Any]] = {}  # the create body, per pod id
        self.desired: dict[str, str] = {}  # a spot pod's GraphQL desiredStatus, per pod id
        self.bid_rise = 0.0
        self.created: dict[str, str] = {}  # createdAt, per pod id
        self.user_prefix = user_prefix

    def next_user(self) -> str:
        """The login user of the next instance created (one per instance)."""
        return f"{self.user_prefix}{len(self.boxes)}"

    def describe(self) -> list[dict[str, Any]]:
        return [{"id": b.id, "status": b.status, "user": b.user} for b in self.boxes.values()]

    def route(self, req: Request) -> tuple[int, Any]:
        auth = req.headers.get("Authorization")
        if auth != f"Bearer {self.token}":
            if req.path == "/graphql":  # unverified: GraphQL's answer to a bad key (HTTP 401 assumed)
                return 401, {"errors": [{"message": "Unauthorized: invalid api key (runpod stand-in)"}]}
            # [S] UnauthorizedError: 401 for a missing, malformed, expired or invalid bearer token; its
            # example's detail is "missing bearer token"; the words for an invalid one are not documented
            return problem(401, "Unauthorized", "missing bearer token" if not auth else "invalid bearer token")
        if req.path == "/graphql" and req.method == "POST":
            return self._graphql(req.body)
        parts = [p for p in req.path.split("/") if p]
        if parts == ["v2", "catalog", "gpus"] and req.method == "GET":
            return self._catalog(req.args)
        if parts[:2] != ["v2", "pods"]:
            return problem(404, "Not Found", "resource not found")  # [S] NotFoundError's example
        if len(parts) == 2:
            if req.method == "GET":
                return 200, {"pods": [self._pod(b) for b in self.boxes.values() if b.status != "TERMINATED"]}
            if req.method == "POST":
                return self._create(req.body)
            return problem(405, "Method Not Allowed", "The requested method is not allowed for this path.")
        box = self.boxes.get(parts[2])
        if box is None or box.status == "TERMINATED":  # [S] deletePod: "no longer appears in listPods"
            return problem(404, "Not Found", "pod not found")  # [S] ErrorResponse's example detail
        if len(parts) == 3 and req.method == "GET":
            return 200, self._pod(box)
        if len(parts) == 3 and req.method == "DELETE":
            return self._delete(box)
        if parts[3:] == ["action"] and req.method == "POST":
            return self._action(box, req.body)
        return problem(405, "Method Not Allowed", "The requested method is not allowed for this path.")

    def _graphql(self, body: Any) -> tuple[int, Any]:
        query = body.get("query") if isinstance(body, dict) else None
        variables = body.get("variables") if isinstance(body, dict) else None
        given = variables.get("input") if isinstance(variables, dict) else None
        if isinstance(query, str) and "podRentInterruptable" in query:
            return self._rent_spot(given)
        if isinstance(query, str) and "lowestPrice" in query:
            return self._lowest(given)
        found = re.search(r'\bpod\(input: \{podId: "([A-Za-z0-9_-]+)"\}\)', query or "")
        if found:
            return self._spot_pod(found.group(1))
        if not isinstance(query, str) or "clientBalance" not in query:
            return 200, {"errors": [{"message": "stand-in: only myself { clientBalance } is served"}]}
        return 200, {"data": {"myself": {"clientBalance": self.balance}}}  # [C] User.ClientBalance, a number

    def _lowest(self, given: Any) -> tuple[int, Any]:
        """[R] ``lowestPrice(input: GpuLowestPriceInput)``: per GPU type, the least bid per GPU
        (null where it is not rented interruptible) and the on-demand price, in the cloud asked."""
        if not isinstance(given, dict) or not isinstance(given.get("gpuCount"), int):
            return 200, {"errors": [{"message": "Variable \"$input\" of required type \"GpuLowestPriceInput!\" "
                                                "was not provided."}]}
        key = "secure" if given.get("secureCloud") else "community"
        rows = [{"id": g["id"], "lowestPrice": {"gpuTypeId": g["id"], "minimumBidPrice": g["spot"][key],
                                                "uninterruptablePrice": g["price"][key] or None}}
                for g in GPU_TYPES]
        return 200, {"data": {"gpuTypes": rows}}

    def _rent_spot(self, given: Any) -> tuple[int, Any]:
        """[P] ``podRentInterruptable``: the input's fields checked, the bid against the least
        one (UNVERIFIED words), no capacity as REST's create says it; the pod, billed at its bid."""
        if not isinstance(given, dict):
            return 200, {"errors": [{"message": "Variable \"$input\" of required type "
                                                "\"PodRentInterruptableInput!\" was not provided."}]}
        unknown = sorted(set(given) - SPOT_FIELDS)
        missing = sorted(SPOT_REQUIRED - set(given))
        if unknown or missing:  # GraphQL's own validation error (its wording is graphql-js's)
            name = (unknown or missing)[0]
            return 200, {"errors": [{"message": f"Field \"{name}\" is not defined by type "
                                                f"\"PodRentInterruptableInput\"." if unknown else
                                                f"Field \"PodRentInterruptableInput.{name}\" of required type "
                                                "was not provided."}]}
        cloud = str(given.get("cloudType", "ALL")).lower()
        count = given.get("gpuCount", 1)
        gpu = next((g for g in GPU_TYPES if g["id"] == given["gpuTypeId"]), None)
        least = gpu["spot"].get(cloud) if gpu is not None and cloud in ("secure", "community") else None
        if least is not None:  # ``min_bid_rises``: the market moved since the search, for this create only
            least, self.bid_rise = round(least + self.bid_rise, 4), 0.0
        if gpu is None or least is None or gpu["stock"][cloud] == "NONE" or count > gpu["maxCount"][cloud]:
            return 200, {"errors": [{"message": NO_CAPACITY}]}
        bid = given["bidPerGpu"]
        if not isinstance(bid, (int, float)) or bid < least:
            return 200, {"errors": [{"message": f"Your bid price of ${bid}/hr is lower than the current minimum bid "
                                                f"price of ${least}/hr for this GPU type."}]}
        env = {e.get("key"): e.get("value") for e in given.get("env") or [] if isinstance(e, dict)}
        body = {"name": given["name"], "image": given["imageName"], "cloud": cloud.upper(),
                "gpu": {"id": gpu["id"], "count": count}, "disk": given.get("containerDiskInGb", 20),
                "mounts": {"persistent": {"size": given.get("volumeInGb", 20),
                                          "path": given.get("volumeMountPath", "/workspace")}},
                "ports": [p for p in str(given.get("ports") or "").split(",") if p], "env": env}
        box = self._made(body, round(bid * count, 4))
        self.desired[box.id] = "RUNNING"
        return 200, {"data": {"podRentInterruptable": {"id": box.id, "desiredStatus": "RUNNING"}}}

    def _spot_pod(self, pod_id: str) -> tuple[int, Any]:
        """[D] ``pod(input: {podId})``: ``podType`` and ``desiredStatus`` (null for a pod not
        held, as GraphQL answers a missing object)."""
        box = self.boxes.get(pod_id)
        if box is None or box.status == "TERMINATED":
            return 200, {"data": {"pod": None}}
        spot = pod_id in self.desired
        desired = self.desired.get(pod_id) or ("RUNNING" if box.status != "EXITED" else "EXITED")
        return 200, {"data": {"pod": {"id": pod_id, "podType": "INTERRUPTABLE" if spot else "RESERVED",
                                      "desiredStatus": desired}}}

    def _catalog(self, args: dict[str, Any]) -> tuple[int, Any]:
        """[S] listGpuTypes: ``product`` is required with ``include=AVAILABILITY`` and valid only
        with it (400 either way); ``count`` and ``cloud`` (default SECURE) scope availability."""
        include, product = args.get("include"), args.get("product")
        if include not in (None, "AVAILABILITY"):
            return invalid(["include: value must be one of 'AVAILABILITY'"])
        if (include is None) != (product is None):
            return problem(400, "Bad Request", "product is required with include=AVAILABILITY, and valid only with it")
        cloud = str(args.get("cloud") or "SECURE")
        if cloud not in ("SECURE", "COMMUNITY"):
            return invalid(["cloud: value must be one of 'SECURE', 'COMMUNITY'"])
        count = int(args.get("count") or 1) if str(args.get("count") or "1").isdigit() else 0
        if count < 1:
            return invalid(["count: must be >= 1"])
        rows = []
        for gpu in GPU_TYPES:
            row = {k: v for k, v in gpu.items() if k != "stock"}
            if include:
                key = cloud.lower()
                fits = gpu[key] and count <= gpu["maxCount"][key]
                row["availability"] = gpu["stock"][key] if fits else "NONE"
                if row["availability"] != "NONE":  # [S] dataCenters: omitted where unavailable everywhere
                    row["dataCenters"] = [{**DATA_CENTER, "availability": row["availability"]}]
            rows.append(row)
        return 200, {"gpus": rows}  # [S] ListGpuTypesResponse

    def _create(self, body: Any) -> tuple[int, Any]:
        """[S] createPod: the body checked as CreatePodRequest, 400 for a cross-field rule or no
        capacity, 201 with the pod (``PROVISIONING``)."""
        problems = _create_problems(body)
        if problems:
            return invalid(problems)
        gpu_ask, cpu_ask = body.get("gpu"), body.get("cpu")
        if (gpu_ask is None) == (cpu_ask is None):  # [S] "Exactly one of gpu or cpu ... enforced at the handler"
            return problem(400, "Bad Request", "exactly one of gpu or cpu must be set")
        mounts = body.get("mounts") or {}
        if "persistent" in mounts and "network" in mounts:  # [S] Mounts: "enforced at the handler with 400"
            return problem(400, "Bad Request", "at most one of mounts.persistent or mounts.network may be set")
        if cpu_ask is not None:
            return problem(400, "Bad Request", "stand-in: CPU pods are not served")
        cloud = body.get("cloud", "SECURE").lower()
        count = gpu_ask.get("count", 1)
        gpu = next((g for g in GPU_TYPES if g["id"] == gpu_ask["id"]), None)
        if gpu is None or not gpu[cloud] or gpu["stock"][cloud] == "NONE" or count > gpu["maxCount"][cloud]:
            return problem(400, "Bad Request", NO_CAPACITY)  # [S] createPod's table: 400 "could not be placed"
        box = self._made(body, round(gpu["price"][cloud] * count, 4))
        if self.create_fault is not None:  # the pod exists and bills; the answer says otherwise
            status, self.create_fault = self.create_fault, None
            return problem(status, "Internal Server Error", "upstream request failed")
        return 201, self._pod(box)

    def _made(self, body: dict[str, Any], price: float) -> Box:
        """A new pod as ``body`` (REST's create body) asks, at ``price``, booting."""
        box = new_box(self.workdir, secrets.token_hex(7), self.next_user(), "PROVISIONING", price, password=False)
        wipe(box)
        key = (body.get("env") or {}).get("PUBLIC_KEY")
        if isinstance(key, str) and key.startswith(("ssh-", "ecdsa-")):
            box.keys.append(key)
        self.boxes[box.id] = box
        self.pods[box.id] = dict(body)
        self.created[box.id] = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self._boot_later(box)
        return box

    def _boot_later(self, box: Box) -> None:
        with box.lock:
            box.status, box.since, box.port = "PROVISIONING", time.time(), 0
        later(self.boot_delay_s, self._boot, box)

    def _boot(self, box: Box) -> None:
        with box.lock:
            if box.status != "PROVISIONING" or box.sshd is not None:
                return
            if self.fail_boots > 0:  # the container failed: no sshd; the stand-in stops billing it
                # (whether RunPod bills an ERROR pod is not documented: [S] Pod.cost names EXITED only)
                self.fail_boots -= 1
                halt(box, new_password=False)
                box.status = "ERROR"
                return
            boot(box, new_password=False)
            serve(box)
            box.status = "RUNNING"

    def _pod(self, box: Box) -> dict[str, Any]:
        """[S] Pod: every required field; ``ssh.direct`` and ``runtime`` only while RUNNING with
        ``22/tcp`` published; ``ssh.proxy`` points at RunPod's proxy, which no test can reach
        (orch must never use it: [S] PodSsh.proxy carries no rsync)."""
        asked = self.pods.get(box.id, {})
        running = box.status == "RUNNING" and box.sshd is not None
        direct = running and "22/tcp" in (asked.get("ports") or [])
        return {
            "id": box.id, "name": asked.get("name"), "status": box.status, "actions": ACTIONS.get(box.status, []),
            "image": asked.get("image"), "args": asked.get("args", ""), "disk": asked.get("disk", 50),
            "mounts": asked.get("mounts", {}), "ports": asked.get("ports", []), "env": asked.get("env", {}),
            "registry": asked.get("registry"), "gpu": {"id": asked.get("gpu", {}).get("id"),
                                                       "count": asked.get("gpu", {}).get("count", 1)},
            "cloud": asked.get("cloud", "SECURE"), "dataCenterId": DATA_CENTER["id"], "cudaVersion": "12.8",
            "ssh": {"proxy": {"host": "ssh.runpod.io", "port": 22, "username": f"{box.id}-64411eb2",
                              "command": f"ssh {box.id}-64411eb2@ssh.runpod.io"},
                    "direct": {"host": "127.0.0.1", "port": box.port, "username": box.user,
                               "command": f"ssh {box.user}@127.0.0.1 -p {box.port}"} if direct else None},
            "template": None, "cost": box.price if box.status in ("PROVISIONING", "STARTING", "RUNNING") else 0.0,
            "locked": False, "globalNetworking": {"enabled": False},
            "runtime": {"uptime": int(time.time() - (box.since or time.time())),
                        "ports": [{"private": 22, "public": box.port, "type": "tcp", "ip": "127.0.0.1"}]}
            if running else None,
            "createdAt": self.created.get(box.id), "startedAt": None,
        }

    def _action(self, box: Box, body: Any) -> tuple[int, Any]:
        """[S] podAction: ``{"action": ...}`` only (422 otherwise), 409 for an action the
        status does not allow, 200 with the pod (204 for terminate)."""
        if not isinstance(body, dict) or "action" not in body:
            return invalid(["$: missing property 'action'"])
        extra = sorted(set(body) - {"action"})
        if extra:
            return invalid([f"$: additional properties {', '.join(repr(k) for k in extra)} not allowed"])
        action = body["action"]
        if action not in ("start", "stop", "restart", "terminate"):
            return invalid(["$.action: value must be one of 'start', 'stop', 'restart', 'terminate'"])
        if action not in ACTIONS.get(box.status, []):
            return problem(409, "Conflict", f"action {action} is not valid for a pod in status {box.status}")
        if action == "terminate":
            return self._delete(box)
        if action == "stop":
            with box.lock:
                halt(box, new_password=False)
                box.status = "EXITED"
            if box.id in self.desired:
                self.desired[box.id] = "EXITED"
            return 200, self._pod(box)
        if box.id in self.desired:
            self.desired[box.id] = "RUNNING"
        if action == "start" and self.out_of_stock > 0:  # unverified: the words and status of this refusal
            self.out_of_stock -= 1
            return problem(400, "Bad Request", "There are not enough free GPUs on the host machine to start this pod.")
        with box.lock:
            halt(box, new_password=False)
        self._boot_later(box)
        return 200, self._pod(box)

    def _delete(self, box: Box) -> tuple[int, Any]:
        with box.lock:
            halt(box, new_password=False)
            wipe(box)
            box.status = "TERMINATED"
        return 204, None  # [S] deletePod: 204, no body

    def admin(self, action: str, args: dict[str, Any]) -> dict[str, Any]:
        if action == "stock":
            self.out_of_stock = int(args.get("refusals", 0))
        elif action == "create_fault":
            self.create_fault = int(args.get("status", 500))
        elif action == "fail_boots":
            self.fail_boots = int(args.get("count", 1))
        elif action == "min_bid_rises":
            self.bid_rise = float(args.get("by", 0.1))
        elif action == "preempt":
            box = self.boxes.get(str(args.get("id")))
            if box is None or box.id not in self.desired or box.status != "RUNNING":
                return {"error": f"{args.get('id')} is not a running spot pod", "billing": self.billing()}
            with box.lock:
                halt(box, new_password=False)
                box.status = "EXITED"
            return {"preempted": box.id, "billing": self.billing()}
        return {"billing": self.billing()}


def _create_problems(body: Any) -> list[str]:
    """What [S] CreatePodRequest's schema refuses in ``body``, in the live API's words ([K])."""
    if not isinstance(body, dict):
        return ["$: expected object"]
    problems = []
    extra = sorted(set(body) - CREATE_FIELDS)
    if extra:
        problems.append(f"$: additional properties {', '.join(repr(k) for k in extra)} not allowed")
    if not isinstance(body.get("name"), str) or not body.get("name"):
        problems.append("$: missing property 'name'")
    if "templateId" not in body and not isinstance(body.get("image"), str):
        problems.append("$: missing property 'image'")
    if body.get("cloud", "SECURE") not in ("SECURE", "COMMUNITY"):
        problems.append("$.cloud: value must be one of 'SECURE', 'COMMUNITY'")
    disk = body.get("disk", 1)
    if not isinstance(disk, int) or isinstance(disk, bool) or disk < 1:
        problems.append("$.disk: must be an integer >= 1")
    env = body.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        problems.append("$.env: expected an object of strings")
    ports = body.get("ports", [])
    if not isinstance(ports, list) or not all(isinstance(p, str) for p in ports):
        problems.append("$.ports: expected an array of strings")
    gpu = body.get("gpu")
    if gpu is not None:
        if not isinstance(gpu, dict) or not isinstance(gpu.get("id"), str):
            problems.append("$.gpu: missing property 'id'")
        else:
            extra = sorted(set(gpu) - GPU_FIELDS)
            if extra:
                problems.append(f"$.gpu: additional properties {', '.join(repr(k) for k in extra)} not allowed")
            count = gpu.get("count", 1)
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                problems.append("$.gpu.count: must be an integer >= 1")
    problems += _mount_problems(body.get("mounts"))
    return problems


def _mount_problems(mounts: Any) -> list[str]:
    """[S] Mounts, PersistentMount (``size`` ≥ 10 and ``path``, nothing else), NetworkMount."""
    if mounts is None:
        return []
    if not isinstance(mounts, dict):
        return ["$.mounts: expected object"]
    problems = []
    extra = sorted(set(mounts) - {"persistent", "network"})
    if extra:
        problems.append(f"$.mounts: additional properties {', '.join(repr(k) for k in extra)} not allowed")
    persistent = mounts.get("persistent")
    if persistent is not None:
        if not isinstance(persistent, dict) or set(persistent) != {"size", "path"}:
            problems.append("$.mounts.persistent: exactly the properties 'size' and 'path' are required")
        elif not isinstance(persistent["size"], int) or persistent["size"] < 10:
            problems.append("$.mounts.persistent.size: must be an integer >= 10")
    return problems

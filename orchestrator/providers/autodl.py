"""AutoDL's developer API for Pro instances (docs/providers.md cites every path and field used).

Every answer is an envelope ``{"code", "msg", "data", "request_id"}``; ``code == "Success"`` is
the only success, and every error orch raises from an answer names its ``request_id`` (what
AutoDL's support asks for). The token goes in the ``Authorization`` header as it is. Money is
in milliyuan (thousandths of a CNY) on the wire and in CNY everywhere in orch. A powered-off
instance is released by AutoDL 15 days after it stopped. Every field of an answer is checked
before use: a port that is not a port, an address with spaces, or a missing field is a
``ProviderError``, never a guess.

AutoDL's API lists no Pro GPU specifications, public images or regions (only the account's own
images), so ``order`` turns a user's words into the uuids of the appendix of AutoDL's Pro API
page (``GPU_SPECS``, ``BASE_IMAGES``, ``REGIONS``) and the private image list; a word that
matches nothing is exit 2 naming what exists. ``create_order`` sends the one create request.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.providers.api import (Balance, Endpoint, Instance, OutOfStock, Provider, ProviderAuthError,
                                        ProviderError, State)
from orchestrator.providers.http import JsonClient, cite, request_id

API_URL = "https://api.autodl.com"
BASE = "/api/v1/dev/instance/pro"
WALLET = "/api/v1/dev/wallet/balance"
RELEASE_AFTER = timedelta(days=15)
MAX_GPUS, MAX_DISK_GB = 4, 500
STATES: dict[str, State] = {
    "running": "running", "shutdown": "off", "starting": "starting", "shutting_down": "stopping",
    "creating": "creating", "releasing": "released", "released": "released", "failed": "failed",
    "removing": "released", "removed": "released",
}
_AUTH_WORDS = ("token", "auth", "unauthor", "实名")
_STOCK_WORDS = ("库存", "无可用", "资源不足", "售罄", "no stock", "sold out", "no available", "out of stock")
_ADDRESS = re.compile(r"^[A-Za-z0-9.:\[\]-]{1,253}$")
_UUID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class GpuSpec:
    """One Pro GPU specification: ``uuid`` is what ``gpu_spec_uuid`` takes, ``name`` what
    AutoDL's console shows, ``words`` other names a user may give (matched loosely)."""

    uuid: str
    name: str
    memory_gb: int
    words: tuple[str, ...] = ()


@dataclass(frozen=True)
class BaseImage:
    """One public base image: ``uuid`` for ``image_uuid``, ``tag`` AutoDL's name of it, ``cuda``
    its CUDA as ``cuda_v_from`` writes it (118 is 11.8)."""

    uuid: str
    tag: str
    cuda: int


# The appendix of https://www.autodl.com/docs/instance_pro_api/ (as mirrored by AutoDL-cli
# src/core/catalog.ts, "last verified 2026-08", and wuzihuang/AUTODL-PLUGIN
# skills/autodl/references/api-reference.md, indexed 2026-08-20).
GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("h800", "H800-80G", 80, ("H800",)),
    GpuSpec("v-48g", "4090-48G", 48, ("RTX 4090", "RTX 4090 48G", "4090")),
    GpuSpec("4090D", "4090D", 24, ("RTX 4090D", "RTX 4090 D")),
    GpuSpec("v-48g-350w", "3090-48G", 48, ("RTX 3090 48G", "3090")),
    GpuSpec("pro6000-p", "PRO6000-96G", 96, ("RTX PRO 6000", "PRO6000")),
    GpuSpec("v-32g-p", "4080(S)-32G", 32, ("RTX 4080", "RTX 4080S", "4080")),
    GpuSpec("5090-p", "5090-32G", 32, ("RTX 5090", "5090")),
)
BASE_IMAGES: tuple[BaseImage, ...] = (
    BaseImage("base-image-l2t43iu6uk", "cuda11.8-cudnn8-devel-ubuntu20.04-py38-torch2.0.0", 118),
    BaseImage("base-image-l374uiucui", "cuda11.3-cudnn8-devel-ubuntu20.04-py38-torch1.11.0", 113),
    BaseImage("base-image-u9r24vthlk", "cuda11.3-cudnn8-devel-ubuntu20.04-py38-torch1.10.0", 113),
    BaseImage("base-image-12be412037", "cuda11.1-cudnn8-devel-ubuntu18.04-py38-torch1.9.0", 111),
    BaseImage("base-image-uxeklgirir", "cuda11.2-cudnn8-devel-ubuntu20.04-py38-tf2.9.0", 112),
    BaseImage("base-image-0gxqmciyth", "cuda11.2-cudnn8-devel-ubuntu18.04-py38-tf2.5.0", 112),
    BaseImage("base-image-4bpg0tt88l", "cuda11.4-py38-tf1.15.5", 114),
    BaseImage("base-image-mbr2n4urrc", "cuda11.6-cudnn8-devel-ubuntu20.04-py38", 116),
    BaseImage("base-image-7bn8iqhkb5", "cudagl11.3-cudnn8-devel-ubuntu20.04-py38", 113),
    BaseImage("base-image-h041hn36yt", "cuda11.1-cudnn8-devel-ubuntu18.04-py38", 111),
    BaseImage("base-image-qkkhitpik5", "cuda10.2-cudnn7-devel-ubuntu18.04-py38", 102),
    BaseImage("base-image-k0vep6kyq8", "cuda9.0-cudnn7-devel-ubuntu16.04-py36", 90),
    BaseImage("base-image-l2843iu23k", "cuda11.8-cudnn8-devel-ubuntu20.04-py38-trt8.5.1", 118),
)
REGIONS: dict[str, str] = {  # data_center_list code -> the console's name
    "westDC2": "西北企业区", "westDC3": "西北B区", "beijingDC1": "北京A区", "beijingDC2": "北京B区",
    "beijingDC3": "北京C区", "beijingDC4": "北京D区", "neimengDC1": "内蒙A区", "neimengDC3": "内蒙C区",
    "foshanDC1": "佛山区", "chongqingDC1": "重庆区", "yangzhouDC1": "扬州区",
}
DEFAULT_CUDA = 118  # cuda_v_from for a private image, whose CUDA orch does not know


@dataclass(frozen=True)
class ProOrder:
    """What ``create_order`` rents, every word already a uuid: ``cuda`` is ``cuda_v_from`` (the
    least CUDA the host's driver supports), ``regions`` empty lets AutoDL choose, ``disk_gb``
    the system disk's expansion (0..500 GB)."""

    spec: GpuSpec
    count: int
    image: str
    image_name: str
    cuda: int
    regions: tuple[str, ...] = ()
    disk_gb: int = 0

    def describe(self) -> str:
        """``1x 4090D (24 GB), image cuda11.8-...-torch2.0.0, any region``."""
        where = ", ".join(f"{code} ({REGIONS.get(code, code)})" for code in self.regions) or "any region"
        disk = f", system disk +{self.disk_gb} GB" if self.disk_gb else ""
        return f"{self.count}x {self.spec.name} ({self.spec.memory_gb} GB), image {self.image_name}, {where}{disk}"


class AutoDL(Provider):
    """AutoDL Pro instances for one developer token."""

    name = "autodl"
    console = "https://www.autodl.com/console"

    def __init__(self, token: str, api_url: str | None = None) -> None:
        self.http = JsonClient(self.name, api_url or API_URL, {"Authorization": token})

    def _call(self, method: str, path: str, call: str, args: dict[str, Any]) -> tuple[Any, str]:
        """``data`` of a ``Success`` answer and its request id ("" when AutoDL gave none); any
        other code is raised with AutoDL's words and the request id."""
        if method == "GET":
            envelope = self.http.request("GET", path, call, query={k: str(v) for k, v in args.items()})
        else:
            envelope = self.http.request("POST", path, call, body=args)
        if not isinstance(envelope, dict) or not isinstance(envelope.get("code"), str):
            raise ProviderError(self.name, call, "answer is not AutoDL's {code, msg, data} envelope")
        rid = request_id(envelope.get("request_id"))
        if envelope["code"] == "Success":
            return envelope.get("data"), rid
        msg = str(envelope.get("msg") or envelope["code"])[:300] + cite(rid)
        text = f"{envelope['code']} {msg}".lower()
        if any(word in text for word in _AUTH_WORDS):
            raise ProviderAuthError(self.name, call, msg)
        if any(word in text for word in _STOCK_WORDS):
            raise OutOfStock(self.name, call, msg)
        raise ProviderError(self.name, call, msg)

    def _pro(self, method: str, action: str, args: dict[str, Any]) -> tuple[Any, str]:
        return self._call(method, f"{BASE}/{action}", action, args)

    def _walk(self, action: str, pages: int) -> list[Any]:
        """Every item of ``data.list`` of the paged POST ``action`` (``page_index``,
        ``page_size`` 100), every page walked up to ``max_page`` (at most ``pages``)."""
        items: list[Any] = []
        page, last = 1, 1
        while page <= min(last, pages):
            data, rid = self._pro("POST", action, {"page_index": page, "page_size": 100})
            found = data.get("list") if isinstance(data, dict) else None
            if not isinstance(found, list):
                raise ProviderError(self.name, action, "answer has no list" + cite(rid))
            items += found
            last = data["max_page"] if isinstance(data.get("max_page"), int) else 1
            page += 1
        return items

    def _rows(self) -> list[dict[str, Any]]:
        """Every instance row of ``list`` (at most 100 pages of 100)."""
        return [row for row in self._walk("list", 100) if isinstance(row, dict) and isinstance(row.get("uuid"), str)]

    def _listed(self, instance_id: str) -> dict[str, Any]:
        """The instance's row of ``list`` (there is no per-instance GET)."""
        for row in self._rows():
            if row["uuid"] == instance_id:
                return row
        raise ProviderError(self.name, "list", f"no instance {instance_id} in this account")

    def _snapshot(self, instance_id: str) -> tuple[dict[str, Any], str]:
        """The snapshot and its request id."""
        data, rid = self._pro("GET", "snapshot", {"instance_uuid": instance_id})
        if not isinstance(data, dict):
            raise ProviderError(self.name, "snapshot", "answer holds no snapshot" + cite(rid))
        return data, rid

    def _price(self, instance_id: str) -> float | None:
        """``payg_price`` of the snapshot in CNY per hour (AutoDL says milliyuan), None if absent."""
        price = self._snapshot(instance_id)[0].get("payg_price")
        return round(price / 1000, 3) if isinstance(price, (int, float)) and price >= 0 else None

    def _instance(self, row: dict[str, Any], price: float | None) -> Instance:
        status = str(row.get("status") or "")[:40]
        state = STATES.get(status, "unknown")
        stopped = _time(row.get("stopped_at"))
        amount = row.get("req_gpu_amount")
        spec = str(row.get("gpu_spec_uuid") or "")[:40]
        named = next((s.name for s in GPU_SPECS if s.uuid == spec), spec)
        return Instance(id=row["uuid"], state=state, status=status, price_per_hour=price, currency="CNY",
                        release_at=stopped + RELEASE_AFTER if state == "off" and stopped else None,
                        label=str(row.get("name") or "")[:100],
                        gpu=f"{amount}x {named}" if isinstance(amount, int) and named else named,
                        created_at=_time(row.get("created_at")))

    def instance(self, instance_id: str) -> Instance:
        return self._instance(self._listed(instance_id), self._price(instance_id))

    def instances(self) -> list[Instance]:
        """Every instance but the released ones; the price (one snapshot each) only for those
        that bill or are about to (creating, starting, running)."""
        found = []
        for row in self._rows():
            known = self._instance(row, None)
            if known.state == "released":
                continue
            if known.state in ("running", "starting", "creating"):
                known = self._instance(row, self._price(known.id))
            found.append(known)
        return found

    def balance(self) -> Balance:
        """The wallet's ``assets`` (milliyuan) in CNY; vouchers are not counted."""
        data, rid = self._call("POST", WALLET, "balance", {})
        assets = data.get("assets") if isinstance(data, dict) else None
        if not isinstance(assets, (int, float)) or isinstance(assets, bool):
            raise ProviderError(self.name, "balance", "answer holds no wallet assets" + cite(rid))
        return Balance(amount=round(assets / 1000, 3), currency="CNY")

    def state(self, instance_id: str) -> tuple[State, str]:
        """The state from ``status`` (one cheap call): orch's word and AutoDL's."""
        status, _ = self._pro("GET", "status", {"instance_uuid": instance_id})
        status = str(status)[:40]
        return STATES.get(status, "unknown"), status

    def stopped_at(self, instance_id: str) -> datetime | None:
        """The instance's row's ``stopped_at`` (one ``list`` walk); None while it is unset."""
        return _time(self._listed(instance_id).get("stopped_at"))

    def endpoint(self, instance_id: str) -> Endpoint:
        snap, rid = self._snapshot(instance_id)
        address, port, password = snap.get("proxy_host"), snap.get("ssh_port"), snap.get("root_password")
        if not (isinstance(address, str) and _ADDRESS.match(address) and isinstance(port, int)
                and 1 <= port <= 65535 and isinstance(password, str) and password):
            raise ProviderError(self.name, "snapshot", "no complete SSH endpoint yet (host, port and password); "
                                "the instance may still be starting" + cite(rid))
        return Endpoint(address=address, port=port, user=_user(snap.get("ssh_command")), password=password)

    def power_on(self, instance_id: str) -> None:
        self._pro("POST", "power_on", {"instance_uuid": instance_id, "payload": "gpu"})

    def power_off(self, instance_id: str) -> None:
        self._pro("POST", "power_off", {"instance_uuid": instance_id})

    def release(self, instance_id: str) -> None:
        self._pro("POST", "release", {"instance_uuid": instance_id})

    def order(self, gpu: str, count: int, image: str, region: str | None, disk_gb: int) -> ProOrder:
        """The words of ``orch rent`` as uuids (``UsageError``, exit 2, naming what exists when
        one matches nothing). An image is a base image's uuid or tag, else one of the
        account's private images by uuid or name (one ``image/private/list`` walk)."""
        if not 1 <= count <= MAX_GPUS:
            raise UsageError(f"AutoDL rents 1 to {MAX_GPUS} GPUs in one Pro instance, not {count}")
        if not 0 <= disk_gb <= MAX_DISK_GB:
            raise UsageError(f"AutoDL expands the system disk by 0 to {MAX_DISK_GB} GB, not {disk_gb}")
        spec = _one_spec(gpu)
        regions: tuple[str, ...] = ()
        if region:
            regions = tuple(_one_region(word) for word in region.split(",") if word.strip())
        wanted = image.strip()
        base = next((b for b in BASE_IMAGES if wanted.lower() in (b.uuid.lower(), b.tag.lower())), None)
        if base is not None:
            return ProOrder(spec, count, base.uuid, base.tag, base.cuda, regions, disk_gb)
        private = self._private_images()
        found = [uuid for uuid, name in private if wanted in (uuid, name)]
        if len(found) != 1:
            mine = ", ".join(f"{uuid} ({name})" for uuid, name in private[:20]) or "none"
            raise UsageError(f"no AutoDL image {wanted!r}: give a base image ({', '.join(b.uuid for b in BASE_IMAGES[:4])}"
                             f", ... or its tag, docs/providers.md) or one of your own images: {mine}")
        return ProOrder(spec, count, found[0], wanted, DEFAULT_CUDA, regions, disk_gb)

    def _private_images(self) -> list[tuple[str, str]]:
        """The account's saved images as (uuid, name) (at most 20 pages of 100)."""
        rows = [row for row in self._walk("image/private/list", 20) if isinstance(row, dict)]
        return [(row["image_uuid"], str(row.get("name") or row.get("image_name") or "")[:100]) for row in rows
                if isinstance(row.get("image_uuid"), str) and _UUID.match(row["image_uuid"])]

    def create_order(self, order: ProOrder, label: str) -> str:
        """Create the Pro instance (pay as you go; it starts at once and bills from
        ``running``); its uuid. Sent once: an ambiguous failure is ``CreateUncertain``."""
        body: dict[str, Any] = {"req_gpu_amount": order.count, "expand_system_disk_by_gb": order.disk_gb,
                                "gpu_spec_uuid": order.spec.uuid, "image_uuid": order.image,
                                "cuda_v_from": order.cuda, "instance_name": label[:60]}
        if order.regions:
            body["data_center_list"] = list(order.regions)
        answer = self.create_once("create", lambda: self._pro("POST", "create", body))
        assert isinstance(answer, tuple)
        data, rid = answer
        uuid = data.get("instance_uuid") if isinstance(data, dict) else data
        if not (isinstance(uuid, str) and _UUID.match(uuid)):
            raise ProviderError(self.name, "create", "answer holds no instance uuid; an instance may have been "
                                f"created: look at {self.console}" + cite(rid))
        return uuid


def _squash(word: str) -> str:
    return "".join(ch for ch in word.lower() if ch.isalnum())


def _one_spec(gpu: str) -> GpuSpec:
    """The spec named by ``gpu`` (its uuid, console name or another name, loosely), else exit 2."""
    want = _squash(gpu)
    for spec in GPU_SPECS:
        if want in {_squash(spec.uuid), _squash(spec.name), *(_squash(w) for w in spec.words)}:
            return spec
    known = ", ".join(f"{s.name} ({s.uuid})" for s in GPU_SPECS)
    raise UsageError(f"no AutoDL Pro GPU {gpu!r}; AutoDL's Pro API documents: {known}")


def _one_region(word: str) -> str:
    """The ``data_center_list`` code of ``word`` (a code or its console name), else exit 2."""
    word = word.strip()
    for code, name in REGIONS.items():
        if word.lower() == code.lower() or word == name:
            return code
    raise UsageError(f"no AutoDL region {word!r}; known: " + ", ".join(f"{c} ({n})" for c, n in REGIONS.items()))


def _user(command: object) -> str:
    """The login user of the snapshot's ``ssh_command`` (``ssh -p 1 root@host``), else root."""
    try:
        words = shlex.split(command) if isinstance(command, str) else []
    except ValueError:
        words = []
    for word in words:
        user, at, _ = word.partition("@")
        if at and re.match(r"^[a-z_][a-z0-9_-]{0,31}$", user):
            return user
    return "root"


def _time(value: object) -> datetime | None:
    """AutoDL's time: an ISO string, or Go's ``{"Time": ..., "Valid": bool}``; None otherwise."""
    if isinstance(value, dict):
        value = value.get("Time") if value.get("Valid") else None
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone(timedelta(hours=8)))

"""A stand-in for AutoDL's developer API (Pro instances and the wallet), whose instances are real
sshd processes on loopback (``boxes.py``).

Sources, cited at each answer below:

- [PRO] AutoDL's Pro instance API page, https://www.autodl.com/docs/instance_pro_api/, as the
  open-source AutoDL-cli mirrors it (github.com/Minato-Aqukin/AutoDL-cli:
  ``src/core/endpoints/instance.ts``, ``src/core/schemas.ts``, ``tests/fixtures/responses.ts``
  — "response bodies copied from AutoDL's official API docs") and wuzihuang/AUTODL-PLUGIN
  ``skills/autodl/references/api-reference.md`` (the required create fields, indexed 2026-08-20);
- [CLIENT] AutoDL-cli ``src/core/client.ts`` (the envelope with ``request_id``, the raw token
  in ``Authorization``, 401/403 for a refused token) and ``tests/integration/client.test.ts``
  (the live out-of-stock reply);
- [WALLET] AutoDL-cli ``src/core/endpoints/account.ts`` and ``schemas.ts`` (``POST
  /api/v1/dev/wallet/balance``, ``assets``/``accumulate``/``voucher_balance`` in milliyuan).

Every answer is the envelope ``{code, msg, data, request_id}`` [CLIENT]; errors are HTTP 200
with a code other than ``Success`` [CLIENT]. What no source shows is marked UNVERIFIED where it
is answered: the refused token's body, the wording of refused parameters, and what a wrong
method or an unknown path gets. The stand-in refuses more than AutoDL may (an unknown field,
which Go's JSON binding would ignore) so that a test fails when orch sends anything the
documentation does not name.

Every power-on gives the instance a new port and a new password (AutoDL may move an instance on
any power cycle); ``running`` is reported before sshd accepts connections, as observed live; a
create makes a new box (a new login user) that bills from ``running``; ``ledger`` holds the
seconds billed per instance. Test-only calls under ``/standin/`` need no token: ``ledger``,
``stock`` (``refusals``: that many power-ons and creates out of stock), ``move`` (a new host
key at the next power-on), ``stopped`` (pretend it stopped N days ago), ``inside_shutdown``
(the box powering itself off, as ``shutdown`` inside an AutoDL instance does), ``create_fault``
(``{"status": 502}``: the next create makes the instance and then answers that error),
``private_image`` (``{"image_uuid", "name"}``: an image saved in the account).
"""

from __future__ import annotations

import secrets
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

from tests.support.standin.boxes import Box, Request, StandinServer, boot, halt, later, new_box, serve, wipe

PRICE_MILLI = 1980  # the held instances' price: 1.98 CNY/h
PRO = "/api/v1/dev/instance/pro/"
WALLET = "/api/v1/dev/wallet/balance"
WALLET_START_MILLI = 500_000  # 500 CNY
CST = timezone(timedelta(hours=8))  # AutoDL's times carry +08:00 [PRO: responses.ts]
# gpu_spec_uuid values of [PRO]'s appendix; the prices (milliyuan per GPU-hour) are the stand-in's own:
# the API states none before an instance exists.
SPEC_PRICES = {"h800": 8880, "v-48g": 1980, "4090D": 1880, "v-48g-350w": 1580, "pro6000-p": 5980,
               "v-32g-p": 1380, "5090-p": 2880}
BASE_IMAGES = {"base-image-l2t43iu6uk", "base-image-l374uiucui", "base-image-u9r24vthlk", "base-image-12be412037",
               "base-image-uxeklgirir", "base-image-0gxqmciyth", "base-image-4bpg0tt88l", "base-image-mbr2n4urrc",
               "base-image-7bn8iqhkb5", "base-image-h041hn36yt", "base-image-qkkhitpik5", "base-image-k0vep6kyq8",
               "base-image-l2843iu23k"}  # [PRO] appendix: public base images
REGIONS = {"westDC2", "westDC3", "beijingDC1", "beijingDC2", "beijingDC3", "beijingDC4", "neimengDC1", "neimengDC3",
           "foshanDC1", "chongqingDC1", "yangzhouDC1"}  # [PRO] appendix: data_center_list codes
NO_STOCK = "当前算力规格暂无库存, 请修改配置或稍等再试"  # [CLIENT: client.test.ts] captured live, code InternalError

Answer = tuple[int, Any]
Fields = dict[str, type | tuple[type, ...]]


class AutoDLStandin(StandinServer):
    """``start()`` serves on 127.0.0.1; ``count`` instances are held from the start, powered off;
    ``create`` adds more (one login user each, ``user_prefix`` + a number)."""

    def __init__(self, workdir: Path, token: str, count: int = 1, boot_delay_s: float = 0.5,
                 users: list[str] | None = None, user_prefix: str = "orchsc") -> None:
        super().__init__(workdir, token, boot_delay_s)
        self.out_of_stock = 0
        self.create_fault: int | None = None
        self.user_prefix = user_prefix
        self.request_ids: list[str] = []
        self.images: list[dict[str, Any]] = []
        self.meta: dict[str, dict[str, Any]] = {}  # per instance: name, spec, GPUs, created_at, price
        for i in range(count):
            user = users[i] if users and i < len(users) else f"orchsi{i}"
            box = new_box(workdir, f"pro-{secrets.token_hex(6)}", user, "shutdown", PRICE_MILLI / 1000, password=True)
            self.boxes[box.id] = box
            self.meta[box.id] = {"name": "", "spec": "v-48g", "gpus": 1, "created_at": datetime.now(CST),
                                 "price": PRICE_MILLI}

    def next_user(self) -> str:
        """The login user of the next instance created."""
        return f"{self.user_prefix}{len(self.boxes)}"

    def describe(self) -> list[dict[str, Any]]:
        return [{"uuid": b.id, "status": b.status, "user": b.user} for b in self.boxes.values()]

    def reply_envelope(self, status: int, code: str, msg: str, data: Any = None) -> Answer:
        """AutoDL's envelope [CLIENT: Envelope<T>], with a request id of its own (kept in
        ``request_ids``: a test finds it in orch's error)."""
        rid = str(uuid.uuid4())
        self.request_ids.append(rid)
        return status, {"code": code, "msg": msg, "data": data, "request_id": rid}

    def route(self, req: Request) -> Answer:
        if req.headers.get("Authorization") != self.token:
            # UNVERIFIED body: [CLIENT] maps HTTP 401/403 to "token invalid or expired".
            return self.reply_envelope(401, "AuthorizeFailed", "token is invalid or expired (登录失效)")
        handlers: dict[str, tuple[str, Callable[[dict[str, Any]], Answer]]] = {
            PRO + "list": ("POST", self._list), PRO + "status": ("GET", self._status),
            PRO + "snapshot": ("GET", self._snapshot), PRO + "power_on": ("POST", self._power_on),
            PRO + "power_off": ("POST", self._power_off), PRO + "release": ("POST", self._release),
            PRO + "create": ("POST", self._create), PRO + "image/private/list": ("POST", self._images),
            WALLET: ("POST", self._wallet),
        }
        found = handlers.get(req.path)
        if found is None or found[0] != req.method:
            # UNVERIFIED: a Go (gin) router's default for an unknown route or a wrong method.
            return 404, "404 page not found"
        return found[1](req.args)

    def _refused(self, args: dict[str, Any], required: Fields, optional: Fields | None = None) -> Answer | None:
        """The refusal of a missing, mistyped or undocumented field, else None. UNVERIFIED words:
        no source shows AutoDL's; [CLIENT] expects them to speak of a param (参数)."""
        optional = optional or {}
        for name, kind in required.items():
            if name not in args:
                return self.reply_envelope(200, "InvalidParams", f"参数错误: {name} is required")
        for name, value in args.items():
            kind = required.get(name) or optional.get(name)
            if kind is None:
                return self.reply_envelope(200, "InvalidParams", f"参数错误: unknown field {name}")
            if not isinstance(value, kind) or isinstance(value, bool):
                return self.reply_envelope(200, "InvalidParams", f"参数错误: {name} has the wrong type")
        return None

    def _box(self, args: dict[str, Any]) -> Box | Answer:
        refused = self._refused(args, {"instance_uuid": str})
        if refused is not None:
            return refused
        box = self.boxes.get(args["instance_uuid"])
        if box is None:  # UNVERIFIED code; AutoDL-cli's NotFoundError matches 不存在 in msg
            return self.reply_envelope(200, "InstanceNotFound", "实例不存在 (instance not found)")
        return box

    def _list(self, args: dict[str, Any]) -> Answer:
        """[PRO] list: body page_index, page_size (both required); data.list[] rows with Go's
        NullTime for stopped_at/started_at [PRO: responses.ts sampleInstanceRaw]."""
        refused = self._refused(args, {"page_index": int, "page_size": int})
        if refused is not None:
            return refused
        size, page = max(1, args["page_size"]), max(1, args["page_index"])
        rows = [self._row(b) for b in self.boxes.values()]
        return self.reply_envelope(200, "Success", "", {
            "list": rows[(page - 1) * size: page * size], "page_index": page, "page_size": size, "offset": 0,
            "max_page": max(1, -(-len(rows) // size)), "result_total": len(rows)})

    def _row(self, box: Box) -> dict[str, Any]:
        meta = self.meta[box.id]
        return {"uuid": box.id, "name": meta["name"], "status": box.status, "sub_status": "", "charge_type": "payg",
                "start_mode": "gpu", "region_sign": "standin", "region_name": "stand-in", "machine_id": "standin",
                "gpu_spec_uuid": meta["spec"], "req_gpu_amount": meta["gpus"],
                "created_at": meta["created_at"].isoformat(timespec="seconds"),
                "stopped_at": {"Time": box.stopped_at.astimezone(CST).isoformat(timespec="seconds")
                               if box.stopped_at else "0001-01-01T00:00:00Z", "Valid": box.stopped_at is not None}}

    def _status(self, args: dict[str, Any]) -> Answer:
        """[PRO] status: GET with instance_uuid (AutoDL-cli sends it as the query); data is the status."""
        box = self._box(args)
        return box if isinstance(box, tuple) else self.reply_envelope(200, "Success", "", box.status)

    def _snapshot(self, args: dict[str, Any]) -> Answer:
        """[PRO] snapshot: payg_price in milliyuan, the SSH endpoint and root password."""
        box = self._box(args)
        if isinstance(box, tuple):
            return box
        on = box.status == "running"
        return self.reply_envelope(200, "Success", "", {
            "region_sign": "standin", "payg_price": self.meta[box.id]["price"],
            "origin_pay_price": self.meta[box.id]["price"] * 3 // 2, "proxy_host": "127.0.0.1",
            "ssh_port": box.port if on else 0, "root_password": box.password if on else "",
            "ssh_command": f"ssh -p {box.port} {box.user}@127.0.0.1" if on else ""})

    def _power_on(self, args: dict[str, Any]) -> Answer:
        """[PRO] power_on: instance_uuid, payload (only "gpu": "暂不支持API以无卡模式开机"), an
        optional start_command; AutoDL-cli probed other payloads live: 不支持的启动模式."""
        refused = self._refused(args, {"instance_uuid": str, "payload": str}, {"start_command": str})
        box = self._box({"instance_uuid": args["instance_uuid"]}) if refused is None else refused
        if isinstance(box, tuple):
            return box
        if args["payload"] != "gpu":
            return self.reply_envelope(200, "InvalidParams", "不支持的启动模式")
        with box.lock:
            if box.status != "shutdown":  # UNVERIFIED words
                return self.reply_envelope(200, "InstanceStatusError", f"实例状态为 {box.status}，不能开机")
            if self.out_of_stock > 0:
                self.out_of_stock -= 1
                return self.reply_envelope(200, "InternalError", NO_STOCK)
            box.status = "starting"
        later(self.boot_delay_s, self._boot, box)
        return self.reply_envelope(200, "Success", "")

    def _boot(self, box: Box) -> None:
        """New port and password (and host key after ``move``); billing from ``running``
        ([PRO]: billing starts when the status is running), reported before sshd listens."""
        with box.lock:
            if box.status not in ("starting", "creating"):
                return
            boot(box, new_password=True)
            box.status, box.since = "running", time.time()
        time.sleep(self.boot_delay_s)
        with box.lock:
            if box.status == "running":
                serve(box)

    def _power_off(self, args: dict[str, Any]) -> Answer:
        """[PRO] power_off: instance_uuid."""
        box = self._box(args)
        if isinstance(box, tuple):
            return box
        with box.lock:
            if box.status not in ("running", "starting"):  # UNVERIFIED words
                return self.reply_envelope(200, "InstanceStatusError", f"实例状态为 {box.status}，不能关机")
            box.status = "shutting_down"
        later(self.boot_delay_s, self._halt, box)
        return self.reply_envelope(200, "Success", "")

    def _halt(self, box: Box) -> None:
        with box.lock:
            halt(box, new_password=True)
            box.status = "shutdown"

    def _release(self, args: dict[str, Any]) -> Answer:
        """[PRO] release: instance_uuid; "power off before releasing, otherwise release may fail"."""
        box = self._box(args)
        if isinstance(box, tuple):
            return box
        with box.lock:
            if box.status != "shutdown":  # UNVERIFIED words
                return self.reply_envelope(200, "InstanceStatusError", "请先关机再释放")
            box.status = "released"
        return self.reply_envelope(200, "Success", "")

    def _create(self, args: dict[str, Any]) -> Answer:
        """[PRO] create (pay as you go): req_gpu_amount 1-4, expand_system_disk_by_gb 0-500,
        gpu_spec_uuid, image_uuid, cuda_v_from required; data_center_list, instance_name,
        start_command optional; data is the new uuid (``pro-76419909953e``) [PRO: responses.ts]."""
        refused = self._refused(args, {"req_gpu_amount": int, "expand_system_disk_by_gb": int, "gpu_spec_uuid": str,
                                       "image_uuid": str, "cuda_v_from": int},
                                {"data_center_list": list, "instance_name": str, "start_command": str})
        if refused is not None:
            return refused
        if not 1 <= args["req_gpu_amount"] <= 4 or not 0 <= args["expand_system_disk_by_gb"] <= 500:
            return self.reply_envelope(200, "InvalidParams", "参数错误: req_gpu_amount 1-4, expand_system_disk_by_gb 0-500")
        if args["gpu_spec_uuid"] not in SPEC_PRICES:  # UNVERIFIED words
            return self.reply_envelope(200, "InvalidParams", f"参数错误: 算力规格 {args['gpu_spec_uuid']} 不存在")
        if args["image_uuid"] not in BASE_IMAGES | {i["image_uuid"] for i in self.images}:
            return self.reply_envelope(200, "InvalidParams", f"参数错误: 镜像 {args['image_uuid']} 不存在")
        regions = args.get("data_center_list", [])
        if any(region not in REGIONS for region in regions):
            return self.reply_envelope(200, "InvalidParams", "参数错误: data_center_list")
        if self.out_of_stock > 0:
            self.out_of_stock -= 1
            return self.reply_envelope(200, "InternalError", NO_STOCK)
        price = SPEC_PRICES[args["gpu_spec_uuid"]] * args["req_gpu_amount"]
        box = new_box(self.workdir, f"pro-{secrets.token_hex(6)}", self.next_user(), "creating", price / 1000,
                      password=True)
        box.stopped_at = None
        wipe(box)  # a new instance starts with an empty disk
        self.boxes[box.id] = box
        self.meta[box.id] = {"name": args.get("instance_name", ""), "spec": args["gpu_spec_uuid"],
                             "gpus": args["req_gpu_amount"], "created_at": datetime.now(CST), "price": price}
        later(self.boot_delay_s, self._boot, box)
        if self.create_fault is not None:
            status, self.create_fault = self.create_fault, None
            return self.reply_envelope(status, "InternalError", "upstream timed out (stand-in fault)")
        return self.reply_envelope(200, "Success", "", box.id)

    def _images(self, args: dict[str, Any]) -> Answer:
        """[PRO] image/private/list: page_index, page_size; rows image_uuid, name, status."""
        refused = self._refused(args, {"page_index": int, "page_size": int})
        if refused is not None:
            return refused
        size, page = max(1, args["page_size"]), max(1, args["page_index"])
        return self.reply_envelope(200, "Success", "", {
            "list": self.images[(page - 1) * size: page * size], "page_index": page, "page_size": size,
            "max_page": max(1, -(-len(self.images) // size)), "result_total": len(self.images)})

    def _wallet(self, args: dict[str, Any]) -> Answer:
        """[WALLET] no parameters; assets (spendable), accumulate (spent), voucher_balance, in
        milliyuan; here the spend is what the ledger billed."""
        refused = self._refused(args, {})
        if refused is not None:
            return refused
        spent = round(sum(b.billed() / 3600 * self.meta[b.id]["price"] for b in self.boxes.values()))
        return self.reply_envelope(200, "Success", "", {"assets": WALLET_START_MILLI - spent, "accumulate": spent,
                                                        "voucher_balance": 0})

    def admin(self, action: str, args: dict[str, Any]) -> dict[str, Any]:
        box = self.boxes.get(str(args.get("instance_uuid")))
        if action == "stock":
            self.out_of_stock = int(args.get("refusals", 0))
        elif action == "move" and box is not None:
            box.move = True
        elif action == "stopped" and box is not None:
            box.stopped_at = datetime.now(timezone.utc) - timedelta(days=float(args.get("days_ago", 0)))
        elif action == "inside_shutdown" and box is not None:
            self._power_off({"instance_uuid": box.id})
        elif action == "create_fault":
            self.create_fault = int(args.get("status", 502))
        elif action == "private_image":
            self.images.append({"image_uuid": str(args["image_uuid"]), "name": str(args.get("name", "")),
                                "status": "finished", "image_size": 1 << 30, "create_at": datetime.now(CST).isoformat()})
        return {"billing": self.billing(), "request_ids": self.request_ids[-5:]}

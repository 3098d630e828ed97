"""A stand-in for AutoDL's developer API (the paths, fields and errors
``orchestrator/providers/autodl.py`` uses), whose instances are real sshd processes on loopback
(``boxes.py``).

Every power-on gives the instance a new port and a new password (AutoDL may move an instance
on any power cycle); ``running`` is reported before sshd accepts connections, as observed live;
``out_of_stock`` refuses that many power-ons; ``ledger`` holds the seconds billed per instance
(from power-on to power-off); a wrong token gets HTTP 401 with AutoDL's envelope. Test-only
calls live under ``/standin/`` and need no token: ``ledger``, ``stock``, ``move`` (a new host key
at the next power-on), ``stopped`` (pretend it stopped N days ago), ``inside_shutdown`` (the
box powering itself off, as ``shutdown`` inside an AutoDL instance does).
"""

from __future__ import annotations

import secrets
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from tests.support.standin.boxes import Box, Request, StandinServer, boot, halt, later, new_box, serve

PRICE_MILLI = 1980  # 1.98 CNY/h
PREFIX = "/api/v1/dev/instance/pro/"


class AutoDLStandin(StandinServer):
    """``start()`` serves on 127.0.0.1; instances start powered off."""

    def __init__(self, workdir: Path, token: str, count: int = 1, boot_delay_s: float = 0.5,
                 users: list[str] | None = None) -> None:
        super().__init__(workdir, token, boot_delay_s)
        self.out_of_stock = 0
        for i in range(count):
            user = users[i] if users and i < len(users) else f"orchsi{i}"
            box = new_box(workdir, f"sd-{secrets.token_hex(5)}", user, "shutdown", PRICE_MILLI / 1000, password=True)
            self.boxes[box.id] = box

    def describe(self) -> list[dict[str, Any]]:
        return [{"uuid": b.id, "status": b.status, "user": b.user} for b in self.boxes.values()]

    def route(self, req: Request) -> tuple[int, Any]:
        if req.headers.get("Authorization") != self.token:
            return 401, {"code": "AuthorizeFailed", "msg": "token is invalid or expired (登录失效)", "data": None}
        action = req.path.removeprefix(PREFIX) if req.path.startswith(PREFIX) else ""
        routes = {("POST", "list"): self._list, ("GET", "status"): self._status, ("GET", "snapshot"): self._snapshot,
                  ("POST", "power_on"): self._power_on, ("POST", "power_off"): self._power_off,
                  ("POST", "release"): self._release}
        route = routes.get((req.method, action))
        if route is None:
            return 404, {"code": "NotFound", "msg": f"no such API {req.method} {req.path}", "data": None}
        if action == "list":
            code, data = self._list(None, req.args)
        else:
            box = self.boxes.get(str(req.args.get("instance_uuid")))
            if box is None:
                return 200, {"code": "InstanceNotFound", "msg": "实例不存在 (instance not found)", "data": None}
            code, data = route(box, req.args)
        return 200, ({"code": "Success", "msg": "", "data": data} if code == "Success" else
                     {"code": code, "msg": data, "data": None})

    def _list(self, _: Box | None, args: dict[str, Any]) -> tuple[str, Any]:
        size = max(1, int(args.get("page_size") or 10))
        page = max(1, int(args.get("page_index") or 1))
        rows = [{"uuid": b.id, "name": b.user, "status": b.status, "charge_type": "payg",
                 "gpu_spec_uuid": "standin-gpu", "req_gpu_amount": 1,
                 "stopped_at": {"Time": b.stopped_at.isoformat() if b.stopped_at else "",
                                "Valid": b.stopped_at is not None}}
                for b in self.boxes.values()]
        return "Success", {"list": rows[(page - 1) * size: page * size], "page_index": page, "page_size": size,
                           "max_page": max(1, -(-len(rows) // size)), "result_total": len(rows)}

    def _status(self, box: Box, _: dict[str, Any]) -> tuple[str, Any]:
        return "Success", box.status

    def _snapshot(self, box: Box, _: dict[str, Any]) -> tuple[str, Any]:
        on = box.status == "running"
        return "Success", {"region_sign": "standin", "payg_price": PRICE_MILLI, "proxy_host": "127.0.0.1",
                           "ssh_port": box.port if on else 0, "root_password": box.password if on else "",
                           "ssh_command": f"ssh -p {box.port} {box.user}@127.0.0.1" if on else ""}

    def _power_on(self, box: Box, args: dict[str, Any]) -> tuple[str, Any]:
        if args.get("payload") != "gpu":
            return "InvalidParams", "不支持的启动模式 (unsupported start mode)"
        with box.lock:
            if box.status != "shutdown":
                return "InstanceStatusError", f"实例状态为 {box.status}，不能开机 (cannot power on)"
            if self.out_of_stock > 0:
                self.out_of_stock -= 1
                return "NoStock", "GPU 库存不足 (no stock of this GPU in the region)"
            box.status, box.since = "starting", time.time()
        later(self.boot_delay_s, self._boot, box)
        return "Success", None

    def _boot(self, box: Box) -> None:
        """New port and password (and host key after ``move``); ``running`` before sshd listens."""
        with box.lock:
            boot(box, new_password=True)
            box.status = "running"
        time.sleep(self.boot_delay_s)
        with box.lock:
            if box.status == "running":
                serve(box)

    def _power_off(self, box: Box, _: dict[str, Any]) -> tuple[str, Any]:
        with box.lock:
            if box.status not in ("running", "starting"):
                return "InstanceStatusError", f"实例状态为 {box.status}，不能关机 (cannot power off)"
            box.status = "shutting_down"
        later(self.boot_delay_s, self._halt, box)
        return "Success", None

    def _halt(self, box: Box) -> None:
        with box.lock:
            halt(box, new_password=True)
            box.status = "shutdown"

    def _release(self, box: Box, _: dict[str, Any]) -> tuple[str, Any]:
        with box.lock:
            if box.status != "shutdown":
                return "InstanceStatusError", "请先关机再释放 (power off before release)"
            box.status = "released"
        return "Success", None

    def admin(self, action: str, args: dict[str, Any]) -> dict[str, Any]:
        box = self.boxes.get(str(args.get("instance_uuid")))
        if action == "stock":
            self.out_of_stock = int(args.get("refusals", 0))
        elif action == "move" and box is not None:
            box.move = True
        elif action == "stopped" and box is not None:
            box.stopped_at = datetime.now(timezone.utc) - timedelta(days=float(args.get("days_ago", 0)))
        elif action == "inside_shutdown" and box is not None:
            self._power_off(box, {})
        return {}

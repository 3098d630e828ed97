"""A stand-in for AutoDL's developer API (the paths, fields and errors
``orchestrator/providers/autodl.py`` uses), whose instances are real sshd processes on loopback.

Every power-on gives the instance a new port and a new password (AutoDL may move an instance
on any power cycle); ``running`` is reported before sshd accepts connections, as observed live;
``out_of_stock`` refuses that many power-ons; ``ledger`` holds the seconds billed per instance
(from power-on to power-off); a wrong token gets HTTP 401 with AutoDL's envelope. Test-only
calls live under ``/standin/`` and need no token: ``ledger``, ``stock``, ``move`` (a new host key
at the next power-on), ``stopped`` (pretend it stopped N days ago), ``inside_shutdown`` (the
box powering itself off, as ``shutdown`` inside an AutoDL instance does).
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import signal
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.sshd import SSHServer, ensure_user, free_port, keygen, start_sshd

PRICE_MILLI = 1980  # 1.98 CNY/h


@dataclass
class Box:
    uuid: str
    user: str
    workdir: Path
    status: str = "shutdown"
    port: int = 0
    password: str = ""
    sshd: SSHServer | None = None
    since: float | None = None
    billed_s: float = 0.0
    stopped_at: datetime | None = None
    move: bool = False
    powered_on: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def end_processes_of(user: str) -> None:
    """SIGKILL every process running as ``user`` (an instance's own login user, which only the
    stand-in's sshd starts processes for): what powering a box off does to them."""
    uid = pwd.getpwnam(user).pw_uid
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass


class AutoDLStandin:
    """``start()`` serves on 127.0.0.1; instances start powered off."""

    def __init__(self, workdir: Path, token: str, count: int = 1, boot_delay_s: float = 0.5,
                 users: list[str] | None = None) -> None:
        self.workdir, self.token, self.boot_delay_s = workdir, token, boot_delay_s
        self.out_of_stock = 0
        self.calls: list[str] = []
        now = datetime.now(timezone.utc)
        self.boxes: dict[str, Box] = {}
        for i in range(count):
            uuid = f"sd-{secrets.token_hex(5)}"
            user = (users or [])[i] if users and i < len(users) else f"orchsi{i}"
            box = Box(uuid, user, workdir / uuid, stopped_at=now)
            box.workdir.mkdir(parents=True, exist_ok=True)
            keygen(box.workdir / "host_ed25519")
            ensure_user(user, secrets.token_hex(8))
            self.boxes[uuid] = box
        self.server: ThreadingHTTPServer | None = None
        self.url = ""

    def describe(self) -> list[dict[str, Any]]:
        return [{"uuid": b.uuid, "status": b.status, "user": b.user} for b in self.boxes.values()]

    def start(self, port: int = 0) -> str:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                standin.handle(self, "GET")

            def do_POST(self) -> None:
                standin.handle(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        return self.url

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        for box in self.boxes.values():
            if box.sshd is not None:
                box.sshd.stop()

    def ledger(self) -> dict[str, float]:
        """Seconds billed per instance, a running one up to now."""
        return {b.uuid: b.billed_s + (time.time() - b.since if b.since is not None else 0.0)
                for b in self.boxes.values()}

    # --- the HTTP side

    def handle(self, req: BaseHTTPRequestHandler, method: str) -> None:
        url = urllib.parse.urlsplit(req.path)
        args: dict[str, Any] = dict(urllib.parse.parse_qsl(url.query))
        length = int(req.headers.get("Content-Length") or 0)
        if length:
            try:
                args.update(json.loads(req.rfile.read(length)))
            except ValueError:
                return self._reply(req, 400, {"code": "InvalidParams", "msg": "body is not JSON", "data": None})
        path = url.path
        if path.startswith("/standin/"):
            return self._reply(req, 200, self._admin(path.removeprefix("/standin/"), args))
        self.calls.append(f"{method} {path}")
        if req.headers.get("Authorization") != self.token:
            return self._reply(req, 401, {"code": "AuthorizeFailed", "msg": "token is invalid or expired (登录失效)",
                                          "data": None})
        prefix = "/api/v1/dev/instance/pro/"
        action = path.removeprefix(prefix) if path.startswith(prefix) else ""
        routes = {("POST", "list"): self._list, ("GET", "status"): self._status, ("GET", "snapshot"): self._snapshot,
                  ("POST", "power_on"): self._power_on, ("POST", "power_off"): self._power_off,
                  ("POST", "release"): self._release}
        route = routes.get((method, action))
        if route is None:
            return self._reply(req, 404, {"code": "NotFound", "msg": f"no such API {method} {path}", "data": None})
        if action != "list":
            box = self.boxes.get(str(args.get("instance_uuid")))
            if box is None:
                return self._reply(req, 200, {"code": "InstanceNotFound", "msg": "实例不存在 (instance not found)",
                                              "data": None})
            code, data = route(box, args)
        else:
            code, data = self._list(None, args)
        body = {"code": "Success", "msg": "", "data": data} if code == "Success" else \
            {"code": code, "msg": data, "data": None}
        self._reply(req, 200, body)

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
        raw = json.dumps(body).encode()
        req.send_response(status)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(raw)))
        req.end_headers()
        req.wfile.write(raw)

    def _list(self, _: Box | None, args: dict[str, Any]) -> tuple[str, Any]:
        size = max(1, int(args.get("page_size") or 10))
        page = max(1, int(args.get("page_index") or 1))
        rows = [{"uuid": b.uuid, "name": b.user, "status": b.status, "charge_type": "payg",
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
        threading.Thread(target=self._boot, args=(box,), daemon=True).start()
        return "Success", None

    def _boot(self, box: Box) -> None:
        """New port and password (and host key after ``move``); ``running`` before sshd listens."""
        time.sleep(self.boot_delay_s)
        with box.lock:
            if box.move:
                for name in ("host_ed25519", "host_ed25519.pub"):
                    (box.workdir / name).unlink(missing_ok=True)
                keygen(box.workdir / "host_ed25519")
                box.move = False
            box.port, box.password = free_port(), secrets.token_urlsafe(12)
            ensure_user(box.user, box.password)
            box.powered_on += 1
            box.status = "running"
        time.sleep(self.boot_delay_s)
        with box.lock:
            if box.status == "running":
                box.sshd = start_sshd(box.workdir, box.workdir / "host_ed25519", box.port)

    def _power_off(self, box: Box, _: dict[str, Any]) -> tuple[str, Any]:
        with box.lock:
            if box.status not in ("running", "starting"):
                return "InstanceStatusError", f"实例状态为 {box.status}，不能关机 (cannot power off)"
            box.status = "shutting_down"
        threading.Thread(target=self._halt, args=(box,), daemon=True).start()
        return "Success", None

    def _halt(self, box: Box) -> None:
        time.sleep(self.boot_delay_s)
        with box.lock:
            if box.sshd is not None:
                box.sshd.stop()
                box.sshd = None
            end_processes_of(box.user)  # a power-off ends every process of the box
            if box.since is not None:
                box.billed_s += time.time() - box.since
                box.since = None
            box.status, box.stopped_at = "shutdown", datetime.now(timezone.utc)
            box.password = secrets.token_hex(8)
            ensure_user(box.user, box.password)  # the old password stops working

    def _release(self, box: Box, _: dict[str, Any]) -> tuple[str, Any]:
        with box.lock:
            if box.status != "shutdown":
                return "InstanceStatusError", "请先关机再释放 (power off before release)"
            box.status = "released"
        return "Success", None

    def _admin(self, action: str, args: dict[str, Any]) -> dict[str, Any]:
        box = self.boxes.get(str(args.get("instance_uuid")))
        if action == "stock":
            self.out_of_stock = int(args.get("refusals", 0))
        elif action == "move" and box is not None:
            box.move = True
        elif action == "stopped" and box is not None:
            box.stopped_at = datetime.now(timezone.utc) - timedelta(days=float(args.get("days_ago", 0)))
        elif action == "inside_shutdown" and box is not None:
            self._power_off(box, {})
        return {"ledger": self.ledger(), "instances": self.describe(), "calls": len(self.calls)}

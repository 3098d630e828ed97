"""What every provider stand-in shares: instances that are real sshd processes on loopback (each
with its own login user), their power cycle, the price ledger, and the local HTTP server.

A box boots on a new port (and a new host key after ``move``), with a new password when its
provider hands out passwords (AutoDL) or with the keys its provider injected
(``~/.ssh/authorized_keys``, as vast.ai and RunPod images do); powering it off ends every
process of its user; the ledger bills the seconds it ran at its price. ``StandinServer`` serves
one provider's paths on 127.0.0.1 (``route``, per provider), answers test-only calls under
``/standin/`` without a token (``admin``), and counts every API call.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support.sshd import SSHServer, ensure_user, free_port, keygen, start_sshd


@dataclass
class Box:
    """One instance. ``status`` is in its provider's words; ``price`` per hour."""

    id: str
    user: str
    workdir: Path
    status: str
    price: float = 0.0
    port: int = 0
    password: str = ""
    keys: list[str] = field(default_factory=list)
    sshd: SSHServer | None = None
    since: float | None = None
    billed_s: float = 0.0
    stopped_at: datetime | None = None
    move: bool = False
    powered_on: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def billed(self) -> float:
        """Seconds billed, a running box up to now."""
        return self.billed_s + (time.time() - self.since if self.since is not None else 0.0)


def new_box(workdir: Path, box_id: str, user: str, status: str, price: float, password: bool) -> Box:
    """A powered-off box with its host key and login user (a password only when ``password``)."""
    box = Box(box_id, user, workdir / box_id, status, price, stopped_at=datetime.now(timezone.utc))
    box.workdir.mkdir(parents=True, exist_ok=True)
    keygen(box.workdir / "host_ed25519")
    ensure_user(user, secrets.token_hex(8) if password else None)
    return box


def boot(box: Box, new_password: bool) -> None:
    """A new port (a new host key after ``move``), a new password when asked, the injected keys
    in place; sshd is not started yet (``serve``). Under ``box.lock``."""
    if box.move:
        for name in ("host_ed25519", "host_ed25519.pub"):
            (box.workdir / name).unlink(missing_ok=True)
        keygen(box.workdir / "host_ed25519")
        box.move = False
    box.port = free_port()
    if new_password:
        box.password = secrets.token_urlsafe(12)
        ensure_user(box.user, box.password)
    write_keys(box)
    box.powered_on += 1


def serve(box: Box) -> None:
    """Start the box's sshd (under ``box.lock``)."""
    box.sshd = start_sshd(box.workdir, box.workdir / "host_ed25519", box.port)


def write_keys(box: Box) -> None:
    """``~/.ssh/authorized_keys`` of the box's user: the keys its provider injected."""
    if not box.keys:
        return
    entry = pwd.getpwnam(box.user)
    ssh = Path(entry.pw_dir) / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    path = ssh / "authorized_keys"
    path.write_text("".join(key.strip() + "\n" for key in box.keys))
    for item in (ssh, path):
        os.chown(item, entry.pw_uid, entry.pw_gid)
    path.chmod(0o600)


def halt(box: Box, new_password: bool) -> None:
    """Power off (under ``box.lock``): sshd stopped, every process of the box's user ended,
    billing stopped; the old password stops working when passwords change per cycle."""
    if box.sshd is not None:
        box.sshd.stop()
        box.sshd = None
    end_processes_of(box.user)
    if box.since is not None:
        box.billed_s += time.time() - box.since
        box.since = None
    box.stopped_at = datetime.now(timezone.utc)
    if new_password:
        box.password = secrets.token_hex(8)
        ensure_user(box.user, box.password)


def wipe(box: Box) -> None:
    """A destroyed box's disk: everything in its user's home goes."""
    home = Path(pwd.getpwnam(box.user).pw_dir)
    for item in home.iterdir():
        if item.is_dir() and not item.is_symlink():
            shutil.rmtree(item, ignore_errors=True)
        else:
            item.unlink(missing_ok=True)


def end_processes_of(user: str) -> None:
    """SIGKILL every process running as ``user`` (a box's own login user, which only the
    stand-in's sshd starts processes for): what powering a box off does to them."""
    uid = pwd.getpwnam(user).pw_uid
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    os.kill(int(entry.name), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                pass


def later(seconds: float, then: Any, *args: Any) -> None:
    """``then(*args)`` on a thread after ``seconds`` (a box booting or halting)."""
    def run() -> None:
        time.sleep(seconds)
        then(*args)
    threading.Thread(target=run, daemon=True).start()


@dataclass
class Request:
    """One API call as a stand-in's ``route`` sees it: ``args`` the query and a JSON object
    body merged, ``body`` the parsed JSON body as sent (None without one)."""

    method: str
    path: str
    args: dict[str, Any]
    headers: dict[str, str]
    body: Any = None


class StandinServer:
    """A provider's API on 127.0.0.1: ``route(request) -> (status, body)`` per provider;
    ``admin(action, args) -> body`` for ``/standin/ACTION`` (no token); ``boxes`` by id."""

    def __init__(self, workdir: Path, token: str, boot_delay_s: float = 0.5) -> None:
        self.workdir, self.token, self.boot_delay_s = workdir, token, boot_delay_s
        self.boxes: dict[str, Box] = {}
        self.calls: list[str] = []
        self.server: ThreadingHTTPServer | None = None
        self.url = ""

    def route(self, req: Request) -> tuple[int, Any]:
        raise NotImplementedError

    def admin(self, action: str, args: dict[str, Any]) -> dict[str, Any]:
        return {}

    def describe(self) -> list[dict[str, Any]]:
        return [{"id": b.id, "status": b.status, "user": b.user} for b in self.boxes.values()]

    def ledger(self) -> dict[str, float]:
        """Seconds billed per instance, a running one up to now."""
        return {b.id: b.billed() for b in self.boxes.values()}

    def billing(self) -> list[str]:
        """The instances billing now."""
        return [b.id for b in self.boxes.values() if b.since is not None]

    def start(self, port: int = 0) -> str:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                standin._handle(self)

            do_GET = do_POST = do_PUT = do_DELETE = _any

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

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(req.path)
        args: dict[str, Any] = dict(urllib.parse.parse_qsl(url.query))
        length, body = int(req.headers.get("Content-Length") or 0), None
        if length:
            try:
                body = json.loads(req.rfile.read(length))
            except ValueError:
                return self.reply(req, 400, {"error": "body is not JSON"})
            if isinstance(body, dict):
                args.update(body)
        if url.path.startswith("/standin/"):
            return self.reply(req, 200, {**self.admin(url.path.removeprefix("/standin/"), args),
                                         "ledger": self.ledger(), "instances": self.describe(),
                                         "calls": list(self.calls)})
        self.calls.append(f"{req.command} {url.path}")
        status, answer = self.route(Request(req.command, url.path, args, dict(req.headers), body))
        self.reply(req, status, answer)

    @staticmethod
    def reply(req: BaseHTTPRequestHandler, status: int, body: Any) -> None:
        raw = b"" if body is None else json.dumps(body).encode()
        try:
            req.send_response(status)
            req.send_header("Content-Type", "application/json")
            req.send_header("Content-Length", str(len(raw)))
            req.end_headers()
            req.wfile.write(raw)
        except (BrokenPipeError, ConnectionResetError):
            pass

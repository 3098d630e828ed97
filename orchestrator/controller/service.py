"""The controller process: one per controller folder, holding its lease for its whole life.

``serve`` takes ``controller.lock`` (flock; a second controller of the same folder is refused
with exit 3, naming the one that runs), writes ``controller.json`` (pid, code, version, start
time), answers on its socket (``wire.py``) and runs its duties every ``ORCH_CONTROLLER_CHECK_S``
(the managed jobs: ``jobs.py``). Secrets arrive over the socket and live in this process's
memory only (its environment, where orch's library reads them): never written to any file; the
names it needs are kept (``secret-names.json``) so that a controller started again without them
says which are missing. SIGTERM or a ``stop`` request ends it after the duty in progress.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from orchestrator import __version__
from orchestrator.controller.layout import Layout
from orchestrator.controller.wire import read_line
from orchestrator.home import private_folder, take_lock, write_private

LEASE_EXIT = 3


def log(message: str) -> None:
    """One timestamped line on stdout (``controller.log``)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    sys.stdout.write(f"{stamp} {message}\n")
    sys.stdout.flush()


def read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default


class Service:
    """The running controller of ``layout`` (code ``code``: the hash it was shipped as)."""

    def __init__(self, layout: Layout, code: str) -> None:
        self.layout, self.code = layout, code
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.held: set[str] = set()   # secret names whose values this process holds (in os.environ)
        self.started_at = time.time()
        self.duty: Callable[[], None] | None = None          # set by jobs.attach
        self.ops: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}
        self.describe: Callable[[], dict[str, Any]] = dict   # more of the status reply (jobs.attach)

    # -- secrets --------------------------------------------------------------------------

    def wanted(self) -> list[str]:
        names = read_json(self.layout.secret_names, [])
        return sorted({n for n in names if isinstance(n, str)}) if isinstance(names, list) else []

    def want(self, names: list[str]) -> None:
        """Add ``names`` to the secrets this controller needs (names only on disk)."""
        with self.lock:
            merged = sorted(set(self.wanted()) | set(names))
            write_private(self.layout.secret_names, json.dumps(merged) + "\n")

    def take_secrets(self, values: dict[str, str]) -> None:
        """Hold ``values`` in memory (this process's environment), and want their names."""
        self.want(list(values))
        with self.lock:
            for name, value in values.items():
                os.environ[name] = value
                self.held.add(name)

    def missing(self) -> list[str]:
        return [n for n in self.wanted() if n not in self.held]

    # -- requests -------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return {"running": True, "pid": os.getpid(), "version": __version__, "code": self.code,
                "started_at": self.started_at, "folder": str(self.layout.folder),
                "secrets": {"held": sorted(self.held), "missing": self.missing()}, **self.describe()}

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "status":
            return self.status()
        if op == "secrets":
            values = request.get("values")
            if not isinstance(values, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                       for k, v in values.items()):
                return {"error": "secrets: values must map names to strings"}
            self.take_secrets(values)
            names = request.get("names")
            self.want([n for n in names if isinstance(n, str)] if isinstance(names, list) else [])
            if values:
                log(f"secrets received: {', '.join(sorted(values))}")
            return self.status()
        if op == "stop":
            log("stop requested")
            self.stopping.set()
            return {"stopping": True, "pid": os.getpid()}
        handler = self.ops.get(str(op))
        if handler is None:
            return {"error": f"unknown request {op!r}"}
        return handler(request)

    def _client(self, conn: socket.socket) -> None:
        with conn:
            try:
                line = read_line(conn)
                if line is None:
                    return
                request = json.loads(line)
                reply = self.answer(request) if isinstance(request, dict) else {"error": "not a JSON object"}
            except Exception as exc:  # noqa: BLE001 - one bad request never ends the controller
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            try:
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except OSError:
                pass

    def _listen(self, server: socket.socket) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._client, args=(conn,), daemon=True, name="controller-client").start()

    # -- the process ----------------------------------------------------------------------

    def serve(self, period: float) -> int:
        """Run until stopped; ``LEASE_EXIT`` at once when another controller holds the lease."""
        self.layout.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = take_lock(self.layout.lock)
        if fd is None:
            other = read_json(self.layout.info, {})
            log(f"refused: another controller (pid {other.get('pid', '?')}) holds {self.layout.lock}")
            return LEASE_EXIT
        sock_path = self.layout.sock
        if sock_path.parent != self.layout.folder and not private_folder(sock_path.parent):
            log(f"refused: {sock_path.parent} is not a private folder")
            return LEASE_EXIT
        try:
            sock_path.unlink()  # a socket left by a controller that was killed: ours now (we hold the lease)
        except FileNotFoundError:
            pass
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(sock_path))
        os.chmod(sock_path, 0o600)
        server.listen(16)
        server.settimeout(0.5)
        write_private(self.layout.info, json.dumps({"pid": os.getpid(), "code": self.code, "version": __version__,
                                                    "started_at": self.started_at}) + "\n")
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        log(f"controller {__version__} ({self.code}) started, pid {os.getpid()}; checks every {period:g} s"
            + (f"; missing secrets: {', '.join(self.missing())} (orch controller up sends them)"
               if self.missing() else ""))
        listener = threading.Thread(target=self._listen, args=(server,), daemon=True, name="controller-listen")
        listener.start()
        try:
            while not self.stopping.is_set():
                if self.duty is not None:
                    try:
                        self.duty()
                    except Exception as exc:  # noqa: BLE001 - a duty's bug is logged, the controller goes on
                        log(f"check failed: {type(exc).__name__}: {exc}")
                self.stopping.wait(period)
        finally:
            server.close()
            try:
                sock_path.unlink()
            except OSError:
                pass
            log("controller stopped")
            os.close(fd)
        return 0

"""The connection holder: one warm SSH connection per host, like OpenSSH's ControlPersist.

``spawn.spawn`` starts ``main`` in the background (detached, its output in a log file)
after a command connected directly; later commands reach it through ``client.py`` and
skip TCP, the SSH handshake and authentication. The holder connects with the pinned host key
only (``trust=never``), serves each client connection as one exec channel on a thread of its
own (``commands.py``), and keeps a few started spares for argv lists asked for ``warm`` (their
output buffered, none lost); the first spares, of the argv its spawner named (orch's helper),
are started as soon as it is connected. It exits when idle for ``ORCH_HOLD_IDLE_S`` (default 600 s) with
no client, when its SSH connection dies, when its socket is removed or replaced or ORCH_HOME is
gone, on SIGTERM/SIGINT, and on ``spawn.stop_holders``; it removes its socket only while
the socket is its own. A second holder for the same place (two CLIs spawning at once) loses
the lock and exits quietly.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import stat
import struct
import sys
import threading
import time
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any

from orchestrator import __version__, settings
from orchestrator.errors import OrchError
from orchestrator.holder.commands import SSH_ERRORS, TICK_S, Commands
from orchestrator.holder.wire import Place, Reader, place, take_lock
from orchestrator.home import orch_home
from orchestrator.hosts.inventory import Host
from orchestrator.transport.base import never
from orchestrator.transport.ssh import SSHTransport

LOG_BYTES = 256 << 10
log = logging.getLogger("orch.holder")


class Holder(Commands):
    """The listening side: clients, when to stop; the commands themselves run in ``Commands``."""

    def __init__(self, host: Host, where: Place, ssh: SSHTransport, home: Path) -> None:
        super().__init__(ssh)
        self.host, self.where, self.home = host, where, home
        self.clients, self.idle_s = 0, settings.HOLD_IDLE.seconds()
        self.last = time.monotonic()
        self.threads: list[threading.Thread] = []
        self.inode: tuple[int, int] | None = None

    def stop(self, reason: str) -> None:
        self.reason = self.reason or reason

    def bind(self) -> socket.socket:
        """Listen on the socket path (0600); a socket left there by a killed holder is
        replaced (the lock says no live holder owns it), anything else is never touched."""
        path = self.where.sock
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                raise FileExistsError(f"{path} exists and is not a socket")
            path.unlink()
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        listener.listen(64)
        listener.settimeout(TICK_S)
        st = os.lstat(path)
        self.inode = (st.st_dev, st.st_ino)
        return listener

    def own(self) -> bool:
        try:
            st = os.lstat(self.where.sock)
        except OSError:
            return False
        return stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == self.inode

    def why_stop(self) -> str | None:
        if self.reason:
            return self.reason
        if not self.connected():
            return "the SSH connection ended" + (" (stalled)" if self.ssh.stalled else "")
        if not self.own():
            return "its socket was removed or replaced"
        if not self.home.is_dir():
            return "ORCH_HOME is gone"
        with self.lock:
            if self.clients == 0 and time.monotonic() - self.last >= self.idle_s:
                return f"idle for {self.idle_s:g} s"
        return None

    def run(self, listener: socket.socket) -> str:
        """Accept clients until a reason to stop comes; that reason."""
        while True:
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                conn = None
            except OSError as exc:  # out of file descriptors, say: keep serving those we have
                log.warning("accept failed: %s", exc)
                conn = None
                time.sleep(TICK_S)
            if conn is not None:
                self.admit(conn)
            reason = self.why_stop()
            if reason:
                return reason
            self.expire_spares()

    def admit(self, conn: socket.socket) -> None:
        if hasattr(socket, "SO_PEERCRED"):  # Linux: drop other users (the folder keeps them out elsewhere)
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
            if uid != os.getuid():
                log.warning("dropped a client of uid %d", uid)
                conn.close()
                return
        with self.lock:
            self.clients += 1
            self.threads = [t for t in self.threads if t.is_alive()]
            thread = threading.Thread(target=self.serve, args=(conn,), daemon=True)
            self.threads.append(thread)
        thread.start()

    def serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(10)
            reader = Reader(conn)
            line = reader.line()
            request = json.loads(line) if line is not None else None
            if not isinstance(request, dict):
                return
            conn.settimeout(None)
            op = request.get("op")
            if op == "ping":
                conn.sendall(json.dumps(self.info()).encode() + b"\n")
            elif op == "stop":
                self.stop("asked to stop")
                conn.sendall(b'{"stopping": true}\n')
            elif op is None and isinstance(request.get("argv"), list) and request["argv"] and \
                    all(isinstance(word, str) for word in request["argv"]):
                self.execute(conn, reader, request["argv"], request.get("warm") is True)
            elif op == "forward" and isinstance(request.get("address"), str) and \
                    isinstance(request.get("port"), int) and not isinstance(request["port"], bool):
                self.forward(conn, request["address"], request["port"])
        except (OSError, ValueError) as exc:
            log.info("a client went away: %s", exc)
        finally:
            with self.lock:
                self.clients -= 1
                self.last = time.monotonic()
            conn.close()

    def info(self) -> dict[str, Any]:
        with self.lock:
            return {"active": self.connected() and not self.reason, "pid": os.getpid(),
                    "home": str(self.home), "host": self.host.name, "target": self.host.target,
                    "clients": self.clients, "served": self.served, "spares": self.spare_count(), "version": __version__}

    def shutdown(self, listener: socket.socket, reason: str) -> None:
        """Stop listening, remove the socket if it is still ours, end every channel (their
        clients get an ``L`` frame), close the SSH connection."""
        self.stop(reason)
        log.info("stopping: %s (served %d commands)", reason, self.served)
        listener.close()
        if self.own():
            self.where.sock.unlink()
        with self.lock:
            channels = [*(ch for q in self.spares.values() for ch in q), *self.busy]
            self.spares.clear()
            threads = list(self.threads)
        for ch in channels:
            ch.close()
        for thread in threads:
            thread.join(timeout=2)
        self.ssh.close()


def _logging(path: Path) -> None:
    handler = RotatingFileHandler(path, maxBytes=LOG_BYTES, backupCount=1)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(process)d] %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    log.setLevel(logging.INFO)
    threading.excepthook = lambda args: log.error(
        "thread %s died", args.thread.name if args.thread else "?",
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback))


def _argv(raw: str) -> list[str]:
    """``ORCH_HOLD_WARM``: a JSON list of strings, or nothing."""
    try:
        value = json.loads(raw) if raw else []
    except ValueError:
        return []
    return value if isinstance(value, list) and all(isinstance(w, str) for w in value) else []


def main() -> None:
    """The holder process (``spawn.spawn``): the host comes in ``ORCH_HOLD_HOST``."""
    os.umask(0o077)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    raw, version = settings.take("ORCH_HOLD_HOST"), settings.take("ORCH_HOLD_VERSION")
    warm = _argv(settings.take("ORCH_HOLD_WARM") or "")
    if raw is None:
        sys.exit("orchestrator.holder.daemon is started by orch itself (see docs/connections.md)")
    host = Host.model_validate_json(raw)
    where = place(host)
    if where is None:
        sys.exit(0)
    _logging(where.log)
    if version != __version__:
        log.warning("started by orch %s but this is orch %s: not holding", version, __version__)
        sys.exit(0)
    lock = take_lock(where.lock)  # held until the process exits
    if lock is None:
        log.info("another holder for %s runs or is starting: leaving it that", host.target)
        sys.exit(0)
    try:
        ssh = SSHTransport(host, trust=never)
    except (OrchError, *SSH_ERRORS) as exc:
        log.warning("could not connect to %s: %s", host.target, exc)
        sys.exit(1)
    holder = Holder(host, where, ssh, orch_home().resolve())
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda num, _frame: holder.stop(f"signal {num}"))
    try:
        listener = holder.bind()
    except OSError as exc:
        log.warning("cannot listen on %s: %s", where.sock, exc)
        ssh.close()
        sys.exit(1)
    log.info("holding %s (%s) for %s, idle limit %g s", host.name, host.target, where.sock, holder.idle_s)
    if warm:
        holder.refill(warm)  # the spawning command's helper: ready before the next command asks
    reason = "crashed"
    try:
        reason = holder.run(listener)
    except Exception:
        log.exception("the holder failed")
    finally:
        holder.shutdown(listener, reason)


if __name__ == "__main__":
    main()

"""The warm server (``orchestrator/warm/client.py`` starts it): imports orch's commands once,
then forks a process per command a client hands it (``child.run``) and tells the client how
that process ended.

Contracts:
- one server per place (``wire.place``): it holds the place's lock for its whole life;
- it forks only while it is single-threaded, and never runs a command itself;
- a command whose client connection closes before it ended (the client was killed) is killed
  with its process group (SIGKILL), as it would have died with the client; the command watches
  its client too (``child.ClientLink``), so this holds when the server itself is gone;
- when a file any loaded module came from (orch's, ``remote_payload``'s, a library's, the
  standard library's), a folder on ``sys.path``, or the metadata of the distribution that
  installed orch (its version) changed since it started (an upgrade, an edit of a checkout), it
  answers ``stale``, stops listening and ends once its running commands ended; the next
  command starts a fresh server;
- it ends after ``ORCH_WARM_IDLE_S`` (600) seconds without a command, and at SIGTERM or an
  ``op: stop`` once its commands ended;
- only its owner reaches it: the socket is in a private folder, and on Linux the peer's uid
  is checked too.
"""

from __future__ import annotations

import gc
import importlib
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator import settings
from orchestrator.holder.wire import ask
from orchestrator.home import take_lock
from orchestrator.warm import child, wire

REQUEST_S = 5.0  # a client sends its request at once; one that does not is dropped

# Modules the commands import only when they run (inside functions; measured: a submit --follow,
# status, logs, fetch, show, plot and queue, and an SSH host's connection): imported here once too.
PRELOAD = ("orchestrator.display.notify", "orchestrator.jobs.logs", "orchestrator.access.connect",
           "orchestrator.holder.client", "orchestrator.transport.ssh")


def main() -> None:
    where = wire.place()
    if where is None:
        return
    try:
        lock = take_lock(where.lock)
    except OSError:
        return
    if lock is None:
        return  # another server holds this place
    Server(where, lock).run()


def preload() -> None:
    """Import every warm command and what they import when they run."""
    from orchestrator.cli import main as cli

    gc.disable()
    try:
        for name in sorted(wire.WARM_COMMANDS):
            cli.cli.get_command(None, name)  # type: ignore[arg-type]  # LazyGroup ignores the context
        for module in PRELOAD:
            try:
                importlib.import_module(module)
            except ImportError:
                pass
    finally:
        gc.freeze()
        gc.enable()


def watched() -> list[str]:
    """What ``stale`` looks at, fixed once the server has imported what it serves with: the file
    of every loaded module, the folders on ``sys.path`` (a package installed or removed) and
    the metadata of the distribution(s) that installed orch."""
    files = {m.__file__ for m in list(sys.modules.values()) if isinstance(getattr(m, "__file__", None), str)}
    return sorted(files) + [p for p in sys.path if p] + distribution_files()


def distribution_files() -> list[str]:
    """The metadata folder and file (its ``Version:``) of each installed distribution on
    ``sys.path`` that holds the ``orchestrator`` package (``top_level.txt``). Never raises: a
    broken distribution elsewhere on the path must not keep the server from starting."""
    from importlib import metadata

    found: list[str] = []
    try:
        for dist in metadata.distributions():
            try:
                top = dist.read_text("top_level.txt") or ""
            except (OSError, UnicodeDecodeError):
                continue
            folder = getattr(dist, "_path", None)  # PathDistribution's (the files of an install)
            if "orchestrator" in top.split() and folder is not None:
                found += [str(folder), *(str(Path(folder, n)) for n in ("METADATA", "PKG-INFO")
                                         if Path(folder, n).exists())]
    except Exception:  # noqa: BLE001 - a path entry importlib.metadata cannot read
        pass
    return found


def code_stamp(paths: list[str]) -> list[tuple[int, int, int]]:
    """Each path's (mtime, size, inode): an edit, a replacement or a removal changes it."""
    stamp = []
    for path in paths:
        try:
            st = os.stat(path)
            stamp.append((st.st_mtime_ns, st.st_size, st.st_ino))
        except OSError:
            stamp.append((-1, -1, -1))
    return stamp


class Server:
    def __init__(self, where: wire.Place, lock: int) -> None:
        self.where, self.lock = where, lock
        self.pid = os.getpid()
        self.children: dict[int, socket.socket] = {}  # command pid -> its client's connection
        self.draining = False
        self.sel = selectors.DefaultSelector()
        self.listener: socket.socket | None = None
        self.watched: list[str] = []
        self.stamp: list[tuple[int, int, int]] = []
        self.wake: tuple[int, int] = (-1, -1)
        self.ended = False  # a command ended since the idle clock was last set

    def run(self) -> None:
        os.umask(0o077)
        for sig in (signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        preload()
        self.watched = watched()
        self.stamp = code_stamp(self.watched)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self.drain())
        self.listener = self.bind()
        self.sel.register(self.listener, selectors.EVENT_READ, "listen")
        self.sel.register(wake_r, selectors.EVENT_READ, "wake")
        self.wake = (wake_r, wake_w)
        last, idle_s = time.monotonic(), settings.WARM_IDLE.seconds()
        try:
            while not (self.draining and not self.children):
                if not self.children and self.ended:  # idle from the end of the last command
                    last, self.ended = time.monotonic(), False
                timeout = None if self.children else max(idle_s - (time.monotonic() - last), 0.0)
                events = self.sel.select(timeout if not self.draining else 1.0)
                if not events and not self.children and time.monotonic() - last >= idle_s:
                    self.drain()
                for key, _ in events:
                    if key.data == "listen":
                        last = time.monotonic()
                        self.admit()
                    elif key.data == "wake":
                        try:
                            os.read(wake_r, 4096)
                        except OSError:
                            pass
                        self.reap()
                    else:
                        self.watch(key.fileobj, key.data)  # type: ignore[arg-type]
                self.reap()
        finally:
            self.drain()

    def bind(self) -> socket.socket:
        """Listen at the place's socket (a file left there by a server that died is removed:
        holding the lock, this is the only server of the place)."""
        path = str(self.where.sock)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        os.chmod(path, 0o600)
        listener.listen(64)
        return listener

    def drain(self) -> None:
        """Stop listening and let the next command start a fresh server; end once the
        running commands ended."""
        self.draining = True
        if self.listener is not None:
            try:
                self.sel.unregister(self.listener)
            except (KeyError, ValueError):
                pass
            self.listener.close()
            self.listener = None
            try:
                os.unlink(self.where.sock)
            except OSError:
                pass
        if self.lock >= 0:
            os.close(self.lock)
            self.lock = -1

    def admit(self) -> None:
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        fds: list[int] = []
        try:
            conn.settimeout(REQUEST_S)
            if not self.same_user(conn):
                return
            first, fds, _, _ = socket.recv_fds(conn, 1, 1)
            lines = wire.Lines(conn)
            if first != b"F" or len(fds) != 1:
                lines.buf = first
                self.operate(conn, lines.next())
                return
            request = valid(lines.next())
            if request is None:
                return
            if self.draining or code_stamp(self.watched) != self.stamp or threading.active_count() > 1:
                self.drain()  # first: the client that hears "stale" finds the lock free and starts a successor
                wire.send(conn, {"stale": True})
                return
            pid = os.fork()
            if pid == 0:
                mine, fds = fds, []  # the command's now
                conn.close()
                conn = None  # type: ignore[assignment]
                self.become(request, mine)
            try:
                os.setpgid(pid, pid)  # as the command does first thing: a signal the client forwards at
            except OSError:  # once reaches its group (as a shell does for its jobs)
                pass
            self.children[pid] = conn
            conn = None  # type: ignore[assignment]  # kept: its end tells the client how it ended
            try:
                wire.send(self.children[pid], {"pid": pid})
            except OSError:  # the client is gone already: so is its command
                kill(pid)
            self.children[pid].setblocking(False)
            self.sel.register(self.children[pid], selectors.EVENT_READ, pid)
        except OSError:
            pass
        finally:
            for fd in fds:
                os.close(fd)
            if conn is not None:
                conn.close()

    def become(self, request: dict[str, Any], fds: list[int]) -> None:
        """In the forked process: drop the server's sockets, run the command, and end as the
        interpreter would — its threads joined, its atexit functions run, its output flushed
        — but without tearing down the modules it shares with the server (that walk over every
        object copies most of the server's memory: ~80 ms measured, longer than a command)."""
        code = 4
        link = None
        try:
            signal.set_wakeup_fd(-1)
            self.sel.close()
            for fd in (self.lock, *self.wake):  # the lock above all: a command must not keep it
                if fd >= 0:
                    os.close(fd)
            if self.listener is not None:
                self.listener.close()
            for other in self.children.values():
                other.close()
            link = child.ClientLink(socket.socket(fileno=fds[0]))
            code = child.run(request, link)
            child.finish()
        except BaseException as exc:  # noqa: BLE001 - whatever it was, this process must not serve
            try:
                sys.stderr.write(f"orch: internal error: {type(exc).__name__}: {exc}\n")
                sys.stderr.flush()
            except Exception:  # noqa: BLE001
                pass
        if link is not None:
            link.report(code)
        os._exit(code)

    def same_user(self, conn: socket.socket) -> bool:
        """The peer runs as this user (Linux; elsewhere the private folder says so)."""
        if not hasattr(socket, "SO_PEERCRED"):
            return True
        cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        return struct.unpack("3i", cred)[1] == os.getuid()

    def operate(self, conn: socket.socket, message: dict[str, Any] | None) -> None:
        """``ping`` (who this server is) and ``stop`` (drain)."""
        op = (message or {}).get("op")
        if op == "ping":
            wire.send(conn, {"home": str(self.where.home), "pid": self.pid, "commands": len(self.children)})
        elif op == "stop":
            wire.send(conn, {"stopping": True})
            self.drain()

    def watch(self, conn: socket.socket, pid: int) -> None:
        """A client connection readable: the client sends nothing, so it closed — kill its
        command's group, as the client's death would have killed it."""
        try:
            data = conn.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            return
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        kill(pid)

    def reap(self) -> None:
        """Every ended command: its exit to its client."""
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            self.ended = True
            try:
                self.sel.unregister(conn)
            except (KeyError, ValueError):
                pass
            try:
                conn.setblocking(True)
                conn.settimeout(1.0)
                if os.WIFSIGNALED(status):
                    wire.send(conn, {"signal": os.WTERMSIG(status)})
                else:
                    wire.send(conn, {"exit": os.waitstatus_to_exitcode(status)})
            except OSError:
                pass
            conn.close()


def kill(pid: int) -> None:
    """SIGKILL to a command and its process group (the group it makes first thing, if it got
    that far)."""
    for send in (os.killpg, os.kill):
        try:
            send(pid, signal.SIGKILL)
        except OSError:
            pass


def valid(message: dict[str, Any] | None) -> dict[str, Any] | None:
    """A command request with fields of the right types, else ``None``."""
    if message is None:
        return None
    argv, env = message.get("argv"), message.get("env")
    ok = (isinstance(argv, list) and all(isinstance(a, str) for a in argv)
          and isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
          and isinstance(message.get("cwd"), str) and isinstance(message.get("umask"), int)
          and isinstance(message.get("t0"), (int, float))
          and isinstance(message.get("ignored"), list) and all(isinstance(s, int) for s in message["ignored"]))
    return message if ok else None


def stop_servers(home: Path, wait_s: float = 5.0) -> None:
    """Ask every warm server of ``home`` to stop and wait until they ended (tests, and a home
    being removed)."""
    home = home.resolve()
    for folder in wire.folders(home):
        for sock_path in sorted(folder.glob("*.sock")) if folder.is_dir() else []:
            try:
                info = ask(sock_path, "ping", timeout=2)  # the holders' op request: the same wire
                if info.get("home") != str(home):
                    continue
                ask(sock_path, "stop", timeout=2)
                pid = int(info["pid"])
            except (OSError, ValueError, KeyError):
                continue
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except OSError:
                    break
                time.sleep(0.05)

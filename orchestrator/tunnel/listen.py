"""The laptop's side of a tunnel: one listening socket per forwarded port, each accepted
connection spliced to a stream on the link (``link.py``).

Listens on 127.0.0.1 unless another address is asked for (``bind``: ``0.0.0.0`` lets other
machines in). A port that is taken is refused before anything connects (``UsageError``, exit 2);
port 0 takes a free one, said in the URL. A connection the host cannot forward (nothing listens
there yet) is closed and said once per reason; the tunnel goes on.
"""

from __future__ import annotations

import errno
import socket
import threading
from typing import Callable

from orchestrator.errors import UsageError
from orchestrator.transport.splice import splice
from orchestrator.tunnel.link import Link
from orchestrator.tunnel.ports import Forward

LOOPBACK = "127.0.0.1"


def listen(bind: str, port: int) -> socket.socket:
    """A listening socket on ``bind:port``; ``UsageError`` naming the port and the way out."""
    try:
        infos = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--bind {bind}: not an address of this machine ({exc.strerror})") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(64)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(f"local port {port} on {bind} is already in use (another tunnel, or a program of "
                             f"this machine): choose another with --local PORT, or --local 0 for a free one") from None
        if exc.errno == errno.EACCES:
            raise UsageError(f"local port {port} on {bind} needs privileges: choose one above 1023 with --local "
                             "PORT") from None
        raise UsageError(f"cannot listen on {bind} port {port}: {exc.strerror or exc}") from None
    return sock


class Tunnel:
    """Listeners for ``forwards`` on ``bind``, their connections through ``link``."""

    def __init__(self, link: Link, forwards: list[Forward], bind: str, say: Callable[[str], None]) -> None:
        self.link, self.forwards, self.bind, self.say = link, forwards, bind, say
        self.listeners: list[socket.socket] = []
        self.bound: list[int] = []
        self._stop = threading.Event()
        self._said: dict[int, str] = {}

    def __enter__(self) -> "Tunnel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def urls(self) -> list[str]:
        """The local URL of each forward, in order."""
        return [self.url(i) for i in range(len(self.forwards))]

    def open(self) -> None:
        """Bind every local port (nothing connects before all are bound), then connect."""
        try:
            for forward in self.forwards:
                self.listeners.append(listen(self.bind, forward.local))
                self.bound.append(int(self.listeners[-1].getsockname()[1]))
        except BaseException:
            self.close()
            raise
        self.link.connect()

    def local_port(self, i: int) -> int:
        """The local port of forward ``i`` (the one chosen for ``--local 0``), also after ``close``."""
        return self.bound[i]

    def url(self, i: int) -> str:
        """``http://127.0.0.1:PORT`` (the loopback address when listening on every address)."""
        host = LOOPBACK if self.bind in ("0.0.0.0", "::", "") else self.bind
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.local_port(i)}"

    def lines(self) -> list[str]:
        """One line per forward: the local URL and what it reaches."""
        where = self.link.target.label
        return [f"{self.url(i)} -> {f.far(self.link.node)} on {where}" for i, f in enumerate(self.forwards)]

    def start(self) -> None:
        """Accept on every listener, and keep the link up, on threads of their own."""
        for i, sock in enumerate(self.listeners):
            threading.Thread(target=self._accept, args=(sock, self.forwards[i]), daemon=True,
                             name=f"tunnel-accept-{i}").start()
        threading.Thread(target=self.link.keep, daemon=True, name="tunnel-link").start()

    def wait(self) -> None:
        """Until ``close`` (or a Ctrl-C in the calling thread); raises the link's ``fatal``."""
        while not self._stop.wait(0.5):
            if self.link.fatal is not None:
                raise self.link.fatal

    def _accept(self, sock: socket.socket, forward: Forward) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, forward), daemon=True).start()

    def _serve(self, conn: socket.socket, forward: Forward) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            stream = self.link.stream(forward.address, forward.port)
        except Exception as exc:  # noqa: BLE001 - ForwardRefused, a link down, anything: this connection fails alone
            conn.close()
            reason = str(exc).splitlines()[0]
            if self._said.get(forward.port) != reason:
                self._said[forward.port] = reason
                self.say(f"{forward.far(self.link.node)}: {reason}")
            return
        self._said.pop(forward.port, None)
        splice(conn, stream, wait=False)

    def close(self) -> None:
        self._stop.set()
        for sock in self.listeners:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread in accept() (Linux)
            except OSError:
                pass
            try:
                sock.close()
            except OSError:
                pass
        self.link.close()

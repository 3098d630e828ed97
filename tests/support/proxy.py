"""A TCP proxy that tests control: cut every connection, cut after N bytes, freeze the
connections that are open now (new ones still flow), or cap each direction's rate (a slow
link). Threads only; bounded; loopback only."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass
class _Conn:
    client: socket.socket
    server: socket.socket
    frozen: threading.Event = field(default_factory=threading.Event)
    closed: bool = False

    def close(self) -> None:
        self.closed = True
        for s in (self.client, self.server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


class FaultProxy:
    """Listens on 127.0.0.1:``port`` and forwards to 127.0.0.1:``target``."""

    def __init__(self, target: int, rate_bps: float | None = None) -> None:
        """``rate_bps``: bytes per second each direction of each connection may carry (None:
        as fast as loopback); ``limit`` changes it later."""
        self.target = target
        self.rate_bps = rate_bps
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.conns: list[_Conn] = []
        self.lock = threading.Lock()
        self.budget: dict[str, int | None] = {"up": None, "down": None}
        self.bytes = {"up": 0, "down": 0}
        self.cuts = 0
        self.running = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self.running:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.running:
                client.close()
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(client, server)
            with self.lock:
                self.conns.append(conn)
            threading.Thread(target=self._pump, args=(conn, client, server, "up"), daemon=True).start()
            threading.Thread(target=self._pump, args=(conn, server, client, "down"), daemon=True).start()

    def _pump(self, conn: _Conn, src: socket.socket, dst: socket.socket, direction: str) -> None:
        free_at = time.monotonic()  # when this direction's link has carried what it was given
        while not conn.closed:
            try:
                data = src.recv(16384 if self.rate_bps else 65536)
            except OSError:
                break
            if not data:
                break
            while conn.frozen.is_set() and not conn.closed:
                time.sleep(0.05)
            with self.lock:
                budget = self.budget[direction]
                if budget is not None:
                    if len(data) >= budget:
                        data = data[:budget]
                        self.budget[direction] = None
                        cut_now = True
                    else:
                        self.budget[direction] = budget - len(data)
                        cut_now = False
                else:
                    cut_now = False
                self.bytes[direction] += len(data)
            if self.rate_bps and data:
                free_at = max(free_at, time.monotonic()) + len(data) / self.rate_bps
                time.sleep(max(0.0, free_at - time.monotonic()))
            try:
                if data:
                    dst.sendall(data)
            except OSError:
                break
            if cut_now:
                self.cut()
                return
        conn.close()

    def cut(self) -> None:
        """Close every open connection now (new connections are still accepted)."""
        with self.lock:
            conns, self.conns = self.conns, []
            self.cuts += 1
        for conn in conns:
            conn.close()

    def cut_after(self, nbytes: int, direction: str = "up") -> None:
        """Cut all connections once ``nbytes`` more bytes have gone ``up`` (to the server)
        or ``down``."""
        with self.lock:
            self.budget[direction] = nbytes

    def limit(self, rate_bps: float | None) -> None:
        """Cap each direction at ``rate_bps`` bytes per second from now on (None: no cap)."""
        self.rate_bps = rate_bps

    def freeze(self) -> None:
        """Stop forwarding on the connections open now, without closing them."""
        with self.lock:
            for conn in self.conns:
                conn.frozen.set()

    def reopen(self) -> None:
        """Listen again on the same port after ``close``: the host is back."""
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.running = True
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        """Stop listening and cut every connection: the host is unreachable from now on."""
        self.running = False
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes a blocked accept(); close() alone does not on Linux
        except OSError:
            pass
        self.listener.close()
        self.cut()

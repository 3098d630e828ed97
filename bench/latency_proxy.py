"""A userspace TCP proxy that behaves like a long, thin link: one-way delay and a rate cap.

This kernel has no netem, so the benchmarks put this between a client and the loopback sshd.
Each direction is modelled as a link of ``rate_bps`` with ``delay_s`` propagation delay:
a chunk read at time t starts to "serialize" when the link is free (``max(t, free)``),
occupies it for ``len * 8 / rate`` seconds, and is delivered ``delay_s`` after it has been
serialized. It is a pipeline, not stop-and-wait: bytes sent back to back arrive back to back
``delay_s`` later, so throughput is bounded by the rate, not by the delay. Byte order is
preserved; a half close (EOF) is forwarded after the data before it. Each direction buffers at
most ``max_buffer`` bytes in flight, after which it stops reading and TCP flow control pushes
back on the sender.

Library::

    with LatencyProxy(target_port=2222) as proxy:   # or proxy.start() / proxy.stop()
        ssh -p proxy.port ...
        proxy.bytes_up, proxy.bytes_down           # client→server, server→client totals

CLI::

    python bench/latency_proxy.py --target 2222 [--port 0] [--delay-ms 20] [--mbit 100]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import socket
import threading
import time

CHUNK = 64 << 10


class _Pipe:
    """One direction of one connection: reader → timestamped queue → writer."""

    def __init__(self, proxy: LatencyProxy, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 upstream: bool) -> None:
        self.proxy, self.reader, self.writer, self.upstream = proxy, reader, writer, upstream
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.buffered = 0
        self.link_free = 0.0
        self.has_data = asyncio.Event()  # set by pump_in, awaited by pump_out
        self.has_room = asyncio.Event()  # set by pump_out, awaited by pump_in

    async def pump_in(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                while self.buffered >= self.proxy.max_buffer:
                    self.has_room.clear()
                    await self.has_room.wait()
                data = await self.reader.read(CHUNK)
                now = loop.time()
                if not data:
                    self.queue.append((max(now, self.link_free) + self.proxy.delay_s, b""))
                    self.has_data.set()
                    return
                start = max(now, self.link_free)
                self.link_free = start + len(data) * 8 / self.proxy.rate_bps
                self.queue.append((self.link_free + self.proxy.delay_s, data))
                self.buffered += len(data)
                self.has_data.set()
        except (ConnectionError, OSError):
            self.queue.append((0.0, b""))
            self.has_data.set()

    async def pump_out(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                while not self.queue:
                    self.has_data.clear()
                    await self.has_data.wait()
                due, data = self.queue.popleft()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if self.writer.can_write_eof():
                        self.writer.write_eof()
                    return
                self.writer.write(data)
                await self.writer.drain()
                self.buffered -= len(data)
                self.proxy._count(self.upstream, len(data))
                self.has_room.set()
        except (ConnectionError, OSError):
            return


class LatencyProxy:
    """Listen on ``host``:``port`` (0: a free port) and forward to ``host``:``target_port``."""

    def __init__(self, target_port: int, *, delay_s: float = 0.020, rate_bps: float = 100e6,
                 host: str = "127.0.0.1", port: int = 0, max_buffer: int = 4 << 20) -> None:
        self.target_port, self.delay_s, self.rate_bps = target_port, delay_s, rate_bps
        self.host, self.port, self.max_buffer = host, port, max_buffer
        self.bytes_up = self.bytes_down = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping: asyncio.Event

    def _count(self, upstream: bool, n: int) -> None:
        with self._lock:
            if upstream:
                self.bytes_up += n
            else:
                self.bytes_down += n

    def counters(self) -> tuple[int, int]:
        """(client→server bytes, server→client bytes) delivered so far."""
        with self._lock:
            return self.bytes_up, self.bytes_down

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        s_writer = None
        try:
            s_reader, s_writer = await asyncio.open_connection(self.host, self.target_port)
            for w in (c_writer, s_writer):
                sock = w.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            up = _Pipe(self, c_reader, s_writer, upstream=True)
            down = _Pipe(self, s_reader, c_writer, upstream=False)
            await asyncio.gather(up.pump_in(), up.pump_out(), down.pump_in(), down.pump_out())
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for w in (c_writer, s_writer):
                if w is not None:
                    w.close()
            self._tasks.discard(task)

    async def _serve(self, ready: threading.Event) -> None:
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        await self._stopping.wait()
        server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await server.wait_closed()

    def start(self) -> int:
        """Serve in a background thread; return the listening port."""
        ready = threading.Event()
        loop = self._loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve(ready))
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="latency-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("latency proxy did not start")
        return self.port

    def stop(self) -> None:
        """Close the listener and every proxied connection; idempotent."""
        if self._loop is None or self._thread is None:
            return
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout=5)
        self._loop = self._thread = None

    def __enter__(self) -> LatencyProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=int, required=True, help="port on 127.0.0.1 to forward to")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    ap.add_argument("--delay-ms", type=float, default=20.0, help="one-way delay (default 20)")
    ap.add_argument("--mbit", type=float, default=100.0, help="rate cap per direction in Mbit/s (default 100)")
    args = ap.parse_args()
    proxy = LatencyProxy(args.target, delay_s=args.delay_ms / 1000, rate_bps=args.mbit * 1e6, port=args.port)
    port = proxy.start()
    print(f"127.0.0.1:{port} -> 127.0.0.1:{args.target}, {args.delay_ms:g} ms each way, "
          f"{args.mbit:g} Mbit/s each way; Ctrl-C to stop", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        proxy.stop()


if __name__ == "__main__":
    main()

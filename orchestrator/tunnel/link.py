"""The connection a tunnel's streams go through, kept up for as long as the tunnel runs.

``connect`` makes the first connection: what fails there fails the command (exit 3 with what was
tried, as any command). Afterwards ``keep`` (on a thread of its own) checks every second that the
connection is up — ``Transport.alive``: paramiko's transport, or the connection holder's word;
a stalled link is closed by the SSH watchdog (``ORCH_KEEPALIVE_S``) — and when it is not,
connects again through ``access.connect.open_transport``: a provider host's endpoint is asked of
its provider on each try (a power cycle changes port and password), a Slurm job's node is asked
of Slurm. Tries back off from 0.5 s to ``RETRY_MAX_S``; each new reason is said once. Only what
trying again cannot fix ends the tunnel: a different host key, a missing password variable or
identity file (``fatal``). A stream asked for while the link is down waits for it (``WAIT_S``).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from orchestrator.access.connect import open_transport
from orchestrator.errors import HostError, HostKeyError, OrchError, UsageError
from orchestrator.hosts.inventory import Inventory
from orchestrator.transport.base import ForwardRefused, Stream, Transport, never
from orchestrator.tunnel.target import LOCALHOST, Target

RETRY_MAX_S = 5.0   # the longest wait between two tries to connect again
CHECK_S = 1.0       # how often the connection is checked
WAIT_S = 30.0       # how long a new local connection waits for the link to come back


class Link:
    """The tunnel's connection to ``target``; ``node`` is what a bare ``PORT`` means there."""

    def __init__(self, target: Target, inventory: Inventory, say: Callable[[str], None]) -> None:
        self.target, self.inventory, self.say = target, inventory, say
        self.node = LOCALHOST
        self.fatal: OrchError | None = None
        self.reconnects = 0
        self._transport: Transport | None = None
        self._cond = threading.Condition()
        self._closed = threading.Event()

    def _open(self) -> tuple[Transport, str]:
        host = self.target.host
        if host.name in self.inventory.names():  # re-read: `orch hosts trust --replace` since, say
            host = self.inventory.get(host.name)
        transport = open_transport(host, self.inventory, never)
        try:
            node = self.target.node(transport)
        except BaseException:
            transport.close()
            raise
        return transport, node

    def connect(self) -> None:
        """The first connection; raises what stops it."""
        transport, node = self._open()
        with self._cond:
            self._transport, self.node = transport, node
            self._cond.notify_all()

    def endpoint(self) -> str:
        """Where the connection goes now (``user@address:port``), for the messages."""
        with self._cond:
            transport = self._transport
        host = getattr(transport, "host", None)
        return getattr(host, "target", self.target.host.name)

    def stream(self, address: str | None, port: int, wait_s: float = WAIT_S) -> Stream:
        """A stream to ``address:port`` (``None``: the node) on the connection, waiting up to
        ``wait_s`` for it to come back when it is down. ``ForwardRefused`` when the host
        cannot connect there; ``HostError`` when the link stayed down."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._transport is not None or self._closed.is_set(),
                                    max(0.0, deadline - time.monotonic()))
                transport, node = self._transport, self.node
            if transport is None:
                raise HostError(f"the connection to {self.target.host.name} is down (trying again)")
            try:
                return transport.forward(address or node, port)
            except ForwardRefused:
                raise
            except HostError as exc:
                self._drop(transport, str(exc).splitlines()[0])
                if time.monotonic() >= deadline:
                    raise

    def _drop(self, transport: Transport, why: str) -> None:
        """Forget ``transport`` (when it is still the current one: said once) and close it."""
        with self._cond:
            if self._transport is not transport:
                return
            self._transport = None
        self.say(f"the connection to {self.target.host.name} was lost ({why}); connecting again")
        try:
            transport.close()
        except Exception:  # noqa: BLE001 - closing a broken connection
            pass

    def keep(self) -> None:
        """Check the connection and connect again while it is down, until ``close``; sets
        ``fatal`` and returns when connecting again cannot succeed."""
        delay, said = 0.5, ""
        while not self._closed.is_set():
            with self._cond:
                transport = self._transport
            if transport is not None:
                if transport.alive():
                    self._closed.wait(CHECK_S)
                    continue
                self._drop(transport, "it no longer answers")
            try:
                transport, node = self._open()
            except (HostKeyError, UsageError) as exc:
                self.fatal = exc
                return
            except Exception as exc:  # noqa: BLE001 - anything else (the link, the provider, Slurm): try again
                reason = (str(exc).splitlines() or [type(exc).__name__])[0]
                if reason != said:
                    self.say(f"cannot connect to {self.target.host.name} yet: {reason}; trying again "
                             f"(every {RETRY_MAX_S:g} s at most; Ctrl-C ends the tunnel)")
                    said = reason
                self._closed.wait(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            if self._closed.is_set():
                transport.close()
                return
            with self._cond:
                self._transport, self.node = transport, node
                self._cond.notify_all()
            self.reconnects += 1
            delay, said = 0.5, ""
            self.say(f"connected again to {self.target.host.name} ({self.endpoint()})")

    def close(self) -> None:
        self._closed.set()
        with self._cond:
            transport, self._transport = self._transport, None
            self._cond.notify_all()
        if transport is not None:
            transport.close()

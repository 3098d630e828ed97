"""``SSHTransport``: one paramiko connection per orch command.

Promises: TCP_NODELAY and keepalive on the socket; connect retried with backoff on network
errors (never on an authentication or host-key failure); the host key must equal the one
pinned in the inventory entry, or the caller must have asked to trust it; every failure to
connect is a ``HostError`` (exit 3) that says what was tried.

The data path (``transport``): AES-GCM preferred when the server offers it (one pass per packet
where CTR adds an HMAC pass, both in Python's per-packet loop), an 8 MiB window and 128 KiB
packets announced for each channel (fewer packets and window adjustments for what the server
sends; a server sends at most its own packet limit). Measured on loopback, one 200 MB stream:
~140 MB/s with paramiko's defaults, ~200 MB/s with these (bench/throughput.py).
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import paramiko

from orchestrator import settings
from orchestrator.errors import HostError, HostKeyError, UsageError
from orchestrator.hosts.inventory import Host
from orchestrator.transport import shell
from orchestrator.transport.base import ForwardRefused, Process, Stream, Transport
from remote_payload.contract.bytequeue import ByteQueue

WINDOW_BYTES = 8 << 20
MAX_PACKET_BYTES = 128 << 10
RECV_BYTES = 2 * WINDOW_BYTES  # more than a channel can hold: one recv takes all of it


def transport(sock: socket.socket, disabled_algorithms: dict[str, list[str]] | None = None) -> paramiko.Transport:
    """paramiko's ``Transport`` with the data path of the module docstring (``SSHClient``'s
    ``transport_factory``); every cipher paramiko offers stays offered, GCM first."""
    made = paramiko.Transport(sock, disabled_algorithms=disabled_algorithms, default_window_size=WINDOW_BYTES,
                              default_max_packet_size=MAX_PACKET_BYTES)
    options = made.get_security_options()
    options.ciphers = tuple(sorted(options.ciphers, key=lambda name: "-gcm@" not in name))
    return made


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's ``SHA256:...`` fingerprint of a public key."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def key_line(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


def parse_key_line(line: str) -> paramiko.PKey:
    kind, _, b64 = line.strip().partition(" ")
    return paramiko.PKey.from_type_string(kind, base64.b64decode(b64))


class _PinnedKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Called only when no key is pinned: record it if trusting, else refuse."""

    def __init__(self, host: Host, trust: Callable[[str], bool]) -> None:
        self.host, self.trust, self.seen = host, trust, None

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        self.seen = key
        if not self.trust(f"{key.get_name()} {fingerprint(key)}"):
            raise HostKeyError(
                f"{self.host.name} ({self.host.target}) presents an unknown host key "
                f"{key.get_name()} {fingerprint(key)}.\n"
                f"If that fingerprint is right, trust it: orch hosts trust {self.host.name}"
            )


class SSHProcess(Process):
    def __init__(self, transport: "SSHTransport", channel: paramiko.Channel, command: str) -> None:
        self.command, self._t, self._chan = command, transport, channel
        self._pending = ByteQueue()  # stdout taken from paramiko, not yet read
        self._err: list[bytes] = []
        self._err_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._err_thread.start()

    def _drain_stderr(self) -> None:
        try:
            while chunk := self._chan.recv_stderr(65536):
                self._err.append(chunk)
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def write(self, data: bytes) -> None:
        try:
            self._chan.sendall(data)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise self._t.lost(exc) from None

    def close_stdin(self) -> None:
        try:
            self._chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass

    def read(self, size: int = 65536) -> bytes:
        """Stdout bytes; ``b""`` at the command's EOF. A dropped connection raises
        ``HostError`` rather than looking like an EOF. Takes everything paramiko holds at
        once (``RECV_BYTES``) and serves ``size`` from it: paramiko keeps a channel's data in
        one array and moves the rest of it on every partial read. A link cut while paramiko
        holds data can cost that data (at most one window, ``WINDOW_BYTES``): ``recv`` sends
        the window adjust after taking the bytes, and a socket that died before the transport
        noticed fails that send. What was read before is the caller's; a fetch resumes there."""
        if not self._pending:
            try:
                data = self._chan.recv(RECV_BYTES)
            except socket.timeout:
                raise
            except (OSError, EOFError, paramiko.SSHException) as exc:
                raise self._t.lost(exc) from None
            if not data and self._chan.recv_exit_status() == -1:  # closed with no exit status: dropped
                raise self._t.lost(None)
            self._pending.put(data)
        return self._pending.take(size)

    def settimeout(self, seconds: float | None) -> None:
        """Make ``read`` raise ``socket.timeout`` after ``seconds`` without data."""
        self._chan.settimeout(seconds)

    def wait(self) -> int:
        self._chan.settimeout(None)
        code = self._chan.recv_exit_status()
        self._err_thread.join(timeout=5)
        if code == -1:
            raise self._t.lost(None)
        return code

    def kill(self) -> None:
        self._chan.close()

    @property
    def stderr(self) -> bytes:
        return b"".join(self._err)


def keepalive(transport: paramiko.Transport, timeout: float) -> bool:
    """One ``keepalive@openssh.com`` round trip (on a thread: paramiko's wait has no timeout).
    True when it ended within ``timeout``: answered, refused (OpenSSH's answer), or failed
    because the transport ended (a dead link is no stall); False when nothing came back in
    time: the link is stalled."""
    done = threading.Event()

    def ping() -> None:
        try:
            transport.global_request("keepalive@openssh.com", wait=True)
        except (OSError, EOFError, paramiko.SSHException):
            pass
        done.set()

    threading.Thread(target=ping, daemon=True).start()
    return done.wait(timeout)


class SSHTransport(Transport):
    """A connected SSH session to one inventory host."""

    def __init__(self, host: Host, *, trust: Callable[[str], bool] = lambda fp: False,
                 on_new_key: Callable[[str], None] | None = None) -> None:
        """``trust(fingerprint)`` decides about a host with no pinned key; ``on_new_key``
        receives the accepted key line to pin it."""
        self.host, self.name = host, host.name
        self.stalled, self.keepalive_s = False, settings.KEEPALIVE.seconds()
        self.client = self._connect(trust, on_new_key)
        transport = self.client.get_transport()
        assert transport is not None
        self._closed = threading.Event()
        threading.Thread(target=self._watchdog, args=(transport,), daemon=True).start()

    def _password(self) -> str | None:
        if self.host.live_password is not None:  # a provider host: from its API, in memory only
            return self.host.live_password
        if not self.host.password_env:
            return None
        value = os.environ.get(self.host.password_env)
        if value is None:
            raise UsageError(f"{self.host.name}: the password variable ${self.host.password_env} is not set")
        return value

    def _connect(self, trust: Callable[[str], bool], on_new_key: Callable[[str], None] | None) -> paramiko.SSHClient:
        host, password = self.host, self._password()
        identity = str(Path(host.identity_file).expanduser()) if host.identity_file else None
        if identity and not Path(identity).is_file():
            raise UsageError(f"{host.name}: identity file {host.identity_file} does not exist")
        delay, last = 0.5, None
        attempts, timeout_s = settings.CONNECT_ATTEMPTS.whole(), settings.CONNECT_TIMEOUT.seconds()
        for attempt in range(1, attempts + 1):
            client = paramiko.SSHClient()
            policy = _PinnedKeyPolicy(host, trust)
            client.set_missing_host_key_policy(policy)
            if host.host_key:
                keyname = host.address if host.port == 22 else f"[{host.address}]:{host.port}"
                pinned = parse_key_line(host.host_key)
                client.get_host_keys().add(keyname, pinned.get_name(), pinned)
            try:
                sock = socket.create_connection((host.address, host.port), timeout=timeout_s)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
                client.connect(
                    host.address, port=host.port, username=host.user, password=password,
                    key_filename=identity, sock=sock, timeout=timeout_s,
                    banner_timeout=timeout_s, auth_timeout=timeout_s,
                    allow_agent=True, look_for_keys=identity is None and password is None,
                    transport_factory=transport,
                )
            except paramiko.BadHostKeyException as exc:
                client.close()
                raise HostKeyError(
                    f"{host.name} ({host.target}) presents a DIFFERENT host key than the one pinned:\n"
                    f"  pinned:  {exc.expected_key.get_name()} {fingerprint(exc.expected_key)}\n"
                    f"  offered: {exc.key.get_name()} {fingerprint(exc.key)}\n"
                    f"Refusing to connect. If the server was reinstalled, check the new fingerprint with "
                    f"its provider, then: orch hosts trust {host.name} --replace"
                ) from None
            except paramiko.AuthenticationException as exc:
                client.close()
                tried = [f"key {host.identity_file}"] if identity else []
                tried += ([] if password is None else ["the provider's password"] if host.live_password is not None
                          else [f"password from ${host.password_env}"])
                tried += ["ssh-agent"] + ([] if tried else ["default keys in ~/.ssh"])
                raise HostError(
                    f"{host.name}: authentication failed for {host.target} ({exc}); tried {', '.join(tried)}.\n"
                    f"If the password or key changed: orch hosts add {host.name} --ssh \"ssh -p PORT user@host\" ..."
                ) from None
            except HostKeyError:
                client.close()
                raise
            except (OSError, EOFError, paramiko.SSHException) as exc:
                client.close()
                last = exc
                if attempt < attempts:
                    time.sleep(delay)
                    delay *= 2
                continue
            if policy.seen is not None and on_new_key is not None:
                on_new_key(key_line(policy.seen))
            return client
        reason = getattr(last, "strerror", None) or str(last) or type(last).__name__
        raise HostError(
            f"cannot reach {host.name} ({host.target}): {reason}; tried {attempts} times.\n"
            f"If the instance was restarted its port may have changed: "
            f"orch hosts add {host.name} --ssh \"ssh -p PORT user@host\""
        )

    def _watchdog(self, transport: paramiko.Transport) -> None:
        """Every ``ORCH_KEEPALIVE_S`` ask the server for a reply; without one within two more
        periods the link is stalled: close it, so every blocked read or request fails as a
        lost connection instead of hanging (paramiko's own keepalive never waits for one)."""
        period = self.keepalive_s
        while not self._closed.wait(period) and transport.is_active():
            if not keepalive(transport, 2 * period) and not self._closed.is_set():
                self.stalled = True
                transport.close()
                return

    def lost(self, exc: BaseException | None) -> HostError:
        detail = f": {exc}" if exc else ""
        if self.stalled:
            detail = f": no answer for {3 * self.keepalive_s:g} s (stalled)"
        return HostError(f"connection to {self.host.name} ({self.host.target}) was lost{detail}")

    def start(self, argv: Sequence[str], *, warm: bool = False) -> Process:
        command = shell.join(argv)
        try:
            transport = self.client.get_transport()
            if transport is None or not transport.is_active():
                raise self.lost(None)
            channel = transport.open_session(timeout=settings.CONNECT_TIMEOUT.seconds())
            channel.exec_command(command)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise self.lost(exc) from None
        return SSHProcess(self, channel, command)

    def forward(self, address: str, port: int) -> Stream:
        """A ``direct-tcpip`` channel to ``address:port`` as the host sees it (``ssh -L``)."""
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise self.lost(None)
        try:
            return transport.open_channel("direct-tcpip", (address, port), ("127.0.0.1", 0),
                                          timeout=settings.CONNECT_TIMEOUT.seconds())
        except paramiko.ChannelException as exc:
            raise ForwardRefused(refused_words(self.host.name, address, port, exc.code, exc.text)) from None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise self.lost(exc) from None

    def alive(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active() and not self._closed.is_set()

    def close(self) -> None:
        self._closed.set()
        self.client.close()


def refused_words(host: str, address: str, port: int, code: int, text: str) -> str:
    """Why the server opened no forward: RFC 4254's reason codes (1: prohibited by its sshd's
    ``AllowTcpForwarding``, 2: nothing accepted the connection there)."""
    if code == 1:
        return (f"{host} does not allow port forwarding ({text or 'administratively prohibited'}): "
                "its sshd_config needs AllowTcpForwarding yes")
    return f"{host} could not connect to {address}:{port} ({text or 'connect failed'}): is something listening there?"

"""``Remote``: the agent's commands as Python calls over one ``Transport``.

The payload is installed on first use (one extra round trip per host and orch version).
An agent failure becomes ``RemoteError``/``CommandFailed`` (exit 4); output from the server
is parsed as untrusted JSON.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Sequence

from orchestrator import pythons, shell
from orchestrator.errors import CommandFailed, RemoteError
from orchestrator.hosts import Host
from orchestrator.payload import BOOT, MISSING_EXIT, payload_hash, payload_tar
from orchestrator.transport.base import Process, Result, Transport

MAX_JSON_BYTES = 64 << 20


# Commands that must see the login environment (conda's PATH, the profile's variables): the
# supervisor inherits it from launch/resume; hello --gpus counts GPUs as the job will.
LOGIN_COMMANDS = frozenset({"install", "launch", "resume", "preflight"})
NOT_RUNNABLE = (126, 127)


class Remote:
    """One host's agent. On an SSH host every command goes through ``bash -l`` until the
    interpreter's absolute path is known (``hello`` reports it; it is cached under
    ``ORCH_HOME``); then only ``LOGIN_COMMANDS`` pay for a login shell."""

    def __init__(self, host: Host, transport: Transport) -> None:
        self.host, self.transport = host, transport
        self.python = sys.executable if host.kind == "local" else host.python
        self.direct = None if host.kind == "local" else pythons.get(host)
        self._installed = False

    def argv(self, command: str, *args: str) -> list[str]:
        tail = ["-c", BOOT, self.host.root, payload_hash(), command, *args]
        if self.host.kind == "local":
            return [self.python, *tail]
        if self.direct is None or command in LOGIN_COMMANDS or (command == "hello" and "--gpus" in args):
            return shell.login_argv([self.python, *tail])
        return [self.direct, *tail]

    def install(self) -> None:
        result = self.transport.run(self.argv("install"), input=payload_tar(), timeout=120)
        if not result.ok:
            raise CommandFailed(result, f"installing orch's helper with {self.python}")
        self._installed = True

    def _run(self, command: str, args: Sequence[str], input: bytes | None, timeout: float | None) -> Result:
        result = self.transport.run(self.argv(command, *args), input=input, timeout=timeout)
        if result.exit_code in NOT_RUNNABLE and self.direct is not None:  # the cached interpreter is gone
            pythons.forget(self.host)
            self.direct = None
            result = self.transport.run(self.argv(command, *args), input=input, timeout=timeout)
        if result.exit_code == MISSING_EXIT and not self._installed:
            self.install()
            result = self.transport.run(self.argv(command, *args), input=input, timeout=timeout)
        self._installed = True
        return result

    def call(self, command: str, *args: str, input: bytes | None = None, timeout: float | None = 300) -> Any:
        """Run an agent command and return its parsed JSON object."""
        result = self._run(command, args, input, timeout)
        value = parse_json(result)
        if command == "hello" and isinstance(value, dict) and self.host.kind != "local":
            found = value.get("python")
            if isinstance(found, str) and found.startswith("/") and found != self.direct:
                pythons.put(self.host, found)
                self.direct = found
        if isinstance(value, dict) and "error" in value:
            raise RemoteError(f"{self.host.name}: {command} failed: {value['error']}")
        if not result.ok:
            raise CommandFailed(result, f"orch helper '{command}'")
        return value

    def start(self, command: str, *args: str) -> Process:
        """Start a streaming agent command (``follow``, ``send``, ``receive``)."""
        if not self._installed:
            self.call("hello")
        return self.transport.start(self.argv(command, *args))

    def finish(self, proc: Process, what: str) -> Any:
        """Read a started command's JSON reply to the end, like ``call`` does."""
        chunks = []
        while chunk := proc.read():
            chunks.append(chunk)
        code = proc.wait()
        result = Result(self.host.name, proc.command, code, b"".join(chunks), proc.stderr)
        value = parse_json(result)
        if isinstance(value, dict) and "error" in value:
            raise RemoteError(f"{self.host.name}: {what} failed: {value['error']}")
        if not result.ok:
            raise CommandFailed(result, what)
        return value


def parse_json(result: Result) -> Any:
    text = result.stdout[:MAX_JSON_BYTES].decode("utf-8", "replace").strip().splitlines()
    if not text:
        if result.ok:
            raise RemoteError(f"{result.host}: the helper printed nothing")
        raise CommandFailed(result, "orch helper")
    try:
        return json.loads(text[-1])
    except ValueError:
        raise CommandFailed(result, "orch helper (unreadable reply)") from None


class FileStream:
    """Reads the agent's ``send`` stream: JSON header lines, each followed by raw bytes."""

    def __init__(self, proc: Any) -> None:
        self.proc, self.buf = proc, b""

    def _fill(self) -> bool:
        chunk = self.proc.read(1 << 20)
        self.buf += chunk
        return bool(chunk)

    def header(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            if len(self.buf) > 4096 or not self._fill():
                err = self.proc.stderr.decode("utf-8", "replace").strip()[-400:] if hasattr(self.proc, "stderr") else ""
                raise RemoteError(f"the file stream broke off{': ' + err if err else ''}")
        line, _, self.buf = self.buf.partition(b"\n")
        try:
            value = json.loads(line)
        except ValueError:
            value = None
        if not isinstance(value, dict):
            raise RemoteError("the file stream holds an unreadable header")
        return value

    def take(self, n: int) -> bytes:
        if not self.buf and not self._fill():
            raise RemoteError("the file stream broke off mid-file")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

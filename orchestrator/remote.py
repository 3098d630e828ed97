"""``Remote``: the agent's commands as Python calls over one ``Transport``.

The payload is installed on first use (one extra round trip per host and orch version).
An agent failure becomes ``RemoteError``/``CommandFailed`` (exit 4); output from the server
is parsed as untrusted JSON.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Sequence

from orchestrator import pythons, shell
from orchestrator.errors import CommandFailed, RemoteError, RootNotWritable
from orchestrator.hosts import Host
from orchestrator.termtext import clean
from orchestrator.payload import BOOT, MISSING_EXIT, ROOT_EXIT, ROOT_MARKER, payload_hash, payload_tar
from orchestrator.transport.base import Process, Result, Transport

MAX_JSON_BYTES = 64 << 20


# Commands that must see the login environment (conda's PATH, the profile's variables): the
# supervisor inherits it from launch/resume; hello --gpus counts GPUs as the job will.
LOGIN_COMMANDS = frozenset({"install", "launch", "resume", "preflight"})
NOT_RUNNABLE = (126, 127)
# How the agent reports an OSError ("PermissionError: [Errno 13] Permission denied: '/x'"):
# permission denied, operation not permitted, read-only file system.
_WRITE_ERROR = re.compile(r"^(?:PermissionError|OSError): \[Errno (?:1|13|30)\] (?P<reason>[^:]+): '(?P<path>[^']*)'")


class Remote:
    """One host's agent. On an SSH host every command goes through ``bash -l`` until the
    interpreter's absolute path is known (``hello`` reports it; it is cached under
    ``ORCH_HOME``); then only ``LOGIN_COMMANDS`` pay for a login shell."""

    def __init__(self, host: Host, transport: Transport) -> None:
        self.host, self.transport = host, transport
        self.python = sys.executable if host.kind == "local" else host.python
        self.direct = None if host.kind == "local" else pythons.get(host)
        self._installed = False
        self.root_seen: str | None = None  # the expanded root, once ``hello`` reported it

    def argv(self, command: str, *args: str) -> list[str]:
        tail = ["-c", BOOT, self.host.root, payload_hash(), command, *args]
        if self.host.kind == "local":
            return [self.python, *tail]
        if self.direct is None or command in LOGIN_COMMANDS or (command == "hello" and "--gpus" in args):
            return shell.login_argv([self.python, *tail])
        return [self.direct, *tail]

    def install(self) -> None:
        """Send the payload. ``RootNotWritable`` (one line, no command) when the host's root
        cannot be created or written; ``CommandFailed`` for any other failure."""
        result = self.transport.run(self.argv("install"), input=payload_tar(), timeout=120)
        if result.exit_code == ROOT_EXIT:
            unwritable = root_not_writable(self.host, result.stderr)
            if unwritable is not None:
                raise unwritable
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
        if isinstance(value, dict) and isinstance(value.get("root"), str) and command == "hello":
            self.root_seen = value["root"].rstrip("/") or "/"
        if isinstance(value, dict) and "error" in value:
            raise self._agent_error(command, value["error"])
        if not result.ok:
            raise CommandFailed(result, f"orch helper '{command}'")
        return value

    def _agent_error(self, what: str, message: object) -> RemoteError:
        """The agent's ``{"error": ...}`` as an exception: a permission or read-only error on
        a path under the root that ``hello`` reported is ``RootNotWritable``."""
        match = _WRITE_ERROR.match(str(message))
        if match and self.root_seen is not None:
            path = match["path"]
            if path == self.root_seen or path.startswith(self.root_seen.rstrip("/") + "/"):
                return RootNotWritable(self.host.name, self.root_seen, clean(match["reason"]), self.host.root)
        return RemoteError(f"{self.host.name}: {what} failed: {message}")

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
            raise self._agent_error(what, value["error"])
        if not result.ok:
            raise CommandFailed(result, what)
        return value


def root_not_writable(host: Host, stderr: bytes) -> RootNotWritable | None:
    """BOOT's ``orch-root-unwritable<TAB>path<TAB>reason`` line (untrusted: cleaned and
    capped) as the one-line error; ``None`` when stderr holds no such line."""
    for line in stderr.decode("utf-8", "replace").splitlines():
        marker, _, rest = line.partition("\t")
        if marker == ROOT_MARKER:
            path, _, reason = rest.partition("\t")
            return RootNotWritable(host.name, clean(path)[:300] or host.root, clean(reason)[:200] or "unknown reason",
                                   host.root)
    return None


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

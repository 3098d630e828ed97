"""The one narrow transport interface, its ``Result`` record, and ``CommandFailed`` (what ran,
its exit code and its last lines, for a person).

A transport runs an argv list on its host: ``start`` gives a streaming ``Process``;
``run`` is ``start`` + feed stdin + collect output, with an optional timeout. Both the SSH
and the local transport implement only ``start`` and ``close``. An SSH transport also opens a
byte stream to a TCP address as the host sees it (``forward``: ``orch tunnel``), and says
whether its connection is still up (``alive``).
"""

from __future__ import annotations

import shlex
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol, Sequence

from orchestrator.errors import RemoteError, UsageError

RAN_MAX_CHARS = 160      # what a CommandFailed message shows of the command that ran
WORD_MAX_CHARS = 60      # a longer argv word (a script, a JSON blob) is shown as a placeholder


@dataclass(frozen=True)
class Result:
    """What one command did: where, what ran (quoted), exit code and both outputs."""

    host: str
    command: str
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Process(ABC):
    """A command running on a host, with its standard streams."""

    command: str

    @abstractmethod
    def write(self, data: bytes) -> None:
        """Send bytes to the command's stdin (blocks while the peer is slow)."""

    @abstractmethod
    def close_stdin(self) -> None:
        """Send EOF on stdin."""

    @abstractmethod
    def read(self, size: int = 65536) -> bytes:
        """Up to ``size`` bytes of stdout; ``b""`` at EOF."""

    @abstractmethod
    def wait(self) -> int:
        """Wait for the exit code; stderr is complete afterwards."""

    @abstractmethod
    def kill(self) -> None:
        """Stop waiting for the command: close the channel or kill the child."""

    @property
    @abstractmethod
    def stderr(self) -> bytes:
        """Everything the command wrote to stderr so far."""


class Stream(Protocol):
    """A byte stream to a TCP address on the host's side (``Transport.forward``): a paramiko
    channel or a socket to the connection holder. ``transport/splice.py`` ends its write side."""

    def recv(self, size: int) -> bytes: ...

    def sendall(self, data: bytes) -> None: ...

    def close(self) -> None: ...


class ForwardRefused(RemoteError):
    """The host could not connect to the address asked for (nothing listens there, or its
    sshd does not allow forwarding): that one stream fails, the connection stays up."""


class Transport(ABC):
    """Runs argv on one host. Raises ``HostError`` when the host cannot be reached."""

    name: str

    @abstractmethod
    def start(self, argv: Sequence[str], *, warm: bool = False) -> Process:
        """Start ``argv`` on the host and return it running. ``warm``: the same argv will
        likely be started again soon, so a transport that can keep one started in advance
        (the connection holder) may hand out such a spare and start the next one."""

    @abstractmethod
    def close(self) -> None:
        """Release the connection; idempotent."""

    def forward(self, address: str, port: int) -> Stream:
        """A stream to ``address:port`` as the host sees it (SSH's ``direct-tcpip``, what
        ``ssh -L`` opens). ``ForwardRefused`` when the host cannot connect there, ``HostError``
        when the connection is lost. Only SSH transports forward."""
        raise UsageError(f"{self.name} is this machine: there is nothing to forward")

    def alive(self) -> bool:
        """Whether the connection is still up (a transport without one: always)."""
        return True

    def run(self, argv: Sequence[str], *, input: bytes | None = None, timeout: float | None = None) -> Result:
        """Run to completion. On timeout the command is stopped and exit code is 124."""
        proc = self.start(argv)
        timed_out = threading.Event()
        timer = None
        if timeout is not None:
            def expire() -> None:
                timed_out.set()
                proc.kill()
            timer = threading.Timer(timeout, expire)
            timer.daemon = True
            timer.start()
        writer = threading.Thread(target=_feed, args=(proc, input or b""), daemon=True)
        writer.start()
        chunks = []
        try:
            while chunk := proc.read():
                chunks.append(chunk)
            code = proc.wait()
        finally:
            if timer is not None:
                timer.cancel()
        writer.join(timeout=5)
        if timed_out.is_set():
            code = 124
        return Result(self.name, proc.command, code, b"".join(chunks), proc.stderr)

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def never(fingerprint: str) -> bool:
    """A ``trust`` answer that accepts no new host key: the pinned one only."""
    return False


def _feed(proc: Process, data: bytes) -> None:
    try:
        if data:
            proc.write(data)
        proc.close_stdin()
    except OSError:
        pass  # the command exited without reading all of its input; its exit code tells


class CommandFailed(RemoteError):
    """A remote command exited non-zero; carries the ``Result`` for the message. The
    command is shown summarised (``short_command``): never a helper's whole source."""

    def __init__(self, result: Result, what: str = "") -> None:
        assert isinstance(result, Result)
        self.result = result
        tail = (result.stderr or result.stdout).decode("utf-8", "replace").strip().splitlines()[-8:]
        head = f"{what} failed" if what else "remote command failed"
        lines = [f"{head} on {result.host} (exit {result.exit_code})", f"  ran: {short_command(result.command)}"]
        lines += [f"  | {line}" for line in tail]
        super().__init__("\n".join(lines))


def short_command(command: str, limit: int = RAN_MAX_CHARS) -> str:
    """A one-line summary of a quoted command for messages: a word that spans lines (the
    helper's source, a script) becomes ``<script, N lines>``, a long one ``<N chars>``; the
    command word of ``bash -lc``/``sh -c`` is summarised the same way inside; at most
    ``limit`` characters. For showing only, never for running."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = [command]
    text = " ".join(_summarise(words, 0))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _summarise(words: list[str], depth: int) -> list[str]:
    out: list[str] = []
    shell = bool(words) and words[0].rsplit("/", 1)[-1] in ("bash", "sh")
    for i, word in enumerate(words):
        if shell and depth < 2 and i > 0 and words[i - 1] in ("-c", "-lc"):
            try:
                out.append(shlex.quote(" ".join(_summarise(shlex.split(word), depth + 1))))
                continue
            except ValueError:
                pass
        if "\n" in word:
            out.append(f"<script, {word.count(chr(10)) + 1} lines>")
        elif len(word) > WORD_MAX_CHARS:
            out.append(f"<{len(word)} chars>")
        else:
            out.append(shlex.quote(word))
    return out

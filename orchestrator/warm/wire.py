"""What the warm server and its clients share: which commands it runs, where a server lives,
and the messages. Standard library only (the client imports it before anything else).

A server lives at ``<folder>/<key>.sock`` (with its ``.lock``) in a private folder:
``ORCH_HOME/warm``, or ``$TMPDIR/orch-<uid>/warm`` where that path is too long for a socket.
The key names what the server's imports depend on — the Python, orch's source folder, ORCH_HOME
and the environment variables read at import time (``ORCH_*`` but ``ORCH_TRACE``, which each
command reads again; ``PYTHON*``; the locale's) — and the version of these messages
(``PROTOCOL``), so a command whose environment differs there gets a server of its own, never a
wrong one.

Messages are JSON lines. The client sends one byte with one end of a socket pair attached
(SCM_RIGHTS), then ``{"argv", "cwd", "env", "umask", "t0", "ignored"}`` (the signals ignored where the client started); or ``{"op": "ping"|"stop"}``
alone. The server answers ``{"pid": N}`` once the command's process exists, then
``{"exit": code}`` or ``{"signal": n}`` when it ended; or ``{"stale": true}`` (its code changed
on disk: the client runs the command itself). The client sends nothing more. On the socket pair
the client says ``{"go": true}`` once it has the pid, with its descriptors 0, 1 and 2 attached
(the command waits for it: a client that gave up on a silent server never has its command run
twice, and no terminal or pipe of its stays held by a stopped server) and answers the command's
``{"ask": question, "default": bool}`` with ``{"answer": true|false|null}`` (it owns the
terminal); the command says ``{"exit": code}`` as it ends. Either end closing means that side
is gone.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import zlib
from pathlib import Path

from orchestrator.home import orch_home, private_folder

TYPE_CHECKING = False  # typing itself costs the client ~9 ms: imported for the type checker only
if TYPE_CHECKING:
    from typing import Any, Iterator

PROTOCOL = 2  # in the key: a client never meets a server that speaks another version of these messages
ANSWER_S = 5.0  # a server that has not started a client's command within this is bypassed
SOCK_MAX = 100  # bytes of a socket path (sun_path: 104 on macOS, 108 on Linux, with NUL)
LINE_MAX = 1 << 22

# The commands a warm server runs: none of them reads the terminal except through
# orchestrator.ask (relayed to the client). Commands that hand the terminal to another program
# (ssh, code, exec) or ask through click (hosts, rent, release) run in the client's process.
WARM_COMMANDS = frozenset({"submit", "status", "ls", "logs", "fetch", "cancel", "resume", "check", "schema",
                           "show", "rerun", "queue", "plot"})

_IMPORT_ENV_PREFIXES = ("ORCH_", "PYTHON", "LC_")
_IMPORT_ENV = ("LANG", "HOME", "TMPDIR", "XDG_DATA_HOME")
_READ_AGAIN = ("ORCH_TRACE",)  # each command reads it again (child.py): a traced command runs warm too
ORCH_SOURCE = Path(__file__).resolve().parents[2]  # the folder holding the orchestrator package


class Place:
    """A server's socket and lock file, and the ORCH_HOME it serves."""

    __slots__ = ("sock", "lock", "home")

    def __init__(self, sock: Path, lock: Path, home: Path) -> None:
        self.sock, self.lock, self.home = sock, lock, home


def key(home: Path) -> str:
    """16 hex naming what a server's imports depend on (module docstring): two 32-bit checksums
    of it (zlib's; hashlib's import alone would cost the client ~5 ms). Only this user's own
    environments meet in a folder, a handful: two of them alike by chance, ~1 in 10^18."""
    env = sorted((k, v) for k, v in os.environ.items()
                 if (k.startswith(_IMPORT_ENV_PREFIXES) or k in _IMPORT_ENV) and k not in _READ_AGAIN)
    data = json.dumps([PROTOCOL, sys.executable, sys.version, str(ORCH_SOURCE), str(home), env]).encode(
        "utf-8", "surrogateescape")
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"


def place() -> Place | None:
    """Where this environment's server lives; ``None`` (run every command in its own process)
    when no private folder can hold a socket path."""
    try:
        home = orch_home().resolve()
    except OSError:
        return None
    name = key(home)
    for folder in folders(home):
        if len(os.fsencode(folder / f"{name}.sock")) > SOCK_MAX:
            continue
        if not (private_folder(folder.parent) and private_folder(folder)):
            return None
        return Place(folder / f"{name}.sock", folder / f"{name}.lock", home)
    return None


def folders(home: Path) -> Iterator[Path]:
    """Where servers of ``home`` may live, in the order they are tried."""
    yield home / "warm"
    import tempfile  # only for a long ORCH_HOME: ~5 ms of the client's start

    yield Path(tempfile.gettempdir()) / f"orch-{os.getuid()}" / "warm"


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode("utf-8", "surrogateescape") + b"\n")


class Lines:
    """The JSON lines arriving on a socket. ``closed`` once the peer is gone, or sent a line that
    is not a JSON object or is longer than ``LINE_MAX``."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.closed = False

    def _one(self) -> dict[str, Any] | None:
        if self.closed or b"\n" not in self.buf:
            self.closed = self.closed or len(self.buf) > LINE_MAX
            return None
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            message = json.loads(line.decode("utf-8", "surrogateescape"))
        except ValueError:
            message = None
        if not isinstance(message, dict):
            self.closed = True
            return None
        return message

    def _read(self) -> None:
        try:
            data = self.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data:
            self.buf += data
        else:
            self.closed = True

    def feed(self) -> list[dict[str, Any]]:
        """One ``recv`` (call it when the socket is readable); the whole lines it completed."""
        self._read()
        out = []
        while (message := self._one()) is not None:
            out.append(message)
        return out

    def next(self) -> dict[str, Any] | None:
        """Block until one whole line came; ``None`` when the peer is gone first."""
        while True:
            message = self._one()
            if message is not None or self.closed:
                return message
            self._read()

"""``orch``'s entry point: hand the command to the warm server, or run it here.

For the commands in ``wire.WARM_COMMANDS`` the client connects to this environment's warm
server and passes it the terminal (descriptors 0, 1, 2), the argv, the working folder, the
environment and the umask; the server forks a process that runs the command on them, and the
client waits and exits with its exit code (or the signal that ended it). Meanwhile it forwards
what a terminal sends it — Ctrl-C (SIGINT), SIGQUIT, SIGHUP, SIGWINCH and SIGCONT to the
command's process group, SIGTERM to the command — and at a Ctrl-Z (SIGTSTP) it stops the
command, then itself, as a shell expects. Questions the command asks (``orchestrator.ask``) are
asked here, where the terminal is. A client killed outright (SIGKILL) takes its command with it:
the server sees the connection close and kills the command's process group.

With no server (the first command, one that idled out, or orch's code changed on disk), the
command runs in this process as it always did, and a server is started in the background for
the next one. ``ORCH_WARM=0`` turns the whole thing off (``eligible``: on Linux by default).
Standard library only, and nothing from orch but ``home``, ``trace``, ``ask`` and the wire.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

from orchestrator import settings, trace
from orchestrator.warm import wire

TYPE_CHECKING = False  # typing costs the client ~9 ms: for the type checker only
if TYPE_CHECKING:
    from typing import Any

# What a terminal or a shell sends orch; those ignored when the client started stay ignored
# (``nohup``, a script's ``&``), here and in the command.
FORWARDED = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGWINCH, signal.SIGCONT, signal.SIGTERM,
             signal.SIGTSTP)


def main() -> None:
    """The ``orch`` console script and ``python -m orchestrator``."""
    argv = sys.argv[1:]
    code = run_warm(argv) if eligible(argv) else None
    if code is None:
        from orchestrator.cli.main import main as run_here

        run_here(argv)
        return
    sys.exit(code)


def eligible(argv: list[str]) -> bool:
    """Whether this command may run on a warm server: on Linux unless ``ORCH_WARM=0``; elsewhere
    (macOS) only with ``ORCH_WARM=1`` — forking a process that imported orch's libraries is
    untried there, and macOS's system frameworks are known to break in forked children."""
    setting = settings.WARM.lenient()  # an unreadable value: orch itself says so, in its own process
    wanted = setting is True or (setting is None and sys.platform.startswith("linux"))
    return bool(argv) and argv[0] in wire.WARM_COMMANDS and wanted and hasattr(socket, "send_fds")


def run_warm(argv: list[str]) -> int | None:
    """The command's exit code (a signal's: ``128 + n``, after this process took the same signal
    where it could); ``None`` when it did not run there and must run here."""
    where = wire.place()
    if where is None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(where.sock))
    except OSError:
        sock.close()
        spawn(where)
        return None
    try:
        code = _session(sock, argv)
    finally:
        sock.close()
    if code is None:  # a server whose code is stale stopped listening: its successor for the next
        spawn(where)
    return code


def _session(sock: socket.socket, argv: list[str]) -> int | None:
    try:
        for fd in (0, 1, 2):
            os.fstat(fd)  # a closed standard descriptor: run here, as Python would
        request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "umask": _umask(), "t0": _t0(),
                   "ignored": [int(s) for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN]}
    except OSError:
        return None
    mine, theirs = socket.socketpair()
    with mine:
        session = Session(sock, mine)
        replaced = session.forward_signals()  # before the request: no Ctrl-C is lost or ends only us
        try:
            try:
                socket.send_fds(sock, [b"F"], [0, 1, 2, theirs.fileno()])
                wire.send(sock, request)
            except OSError:
                return None
            finally:
                theirs.close()
            return session.wait()
        finally:
            for sig, handler in replaced.items():
                signal.signal(sig, handler)


class Session:
    """One command on the server: its pid, the signals to forward, the questions to ask."""

    def __init__(self, sock: socket.socket, ctl: socket.socket) -> None:
        self.sock, self.ctl = sock, ctl
        self.server, self.asks = wire.Lines(sock), wire.Lines(ctl)
        self.pid: int | None = None
        self.pending: list[int] = []
        self.asking = False

    def forward(self, signum: int, _frame: Any = None) -> None:
        if self.pid is None:
            self.pending.append(signum)
            return
        try:
            if signum == signal.SIGTSTP:
                os.killpg(self.pid, signal.SIGTSTP)
                signal.signal(signal.SIGTSTP, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTSTP)  # stops here; a SIGCONT continues below
                signal.signal(signal.SIGTSTP, self.forward)
            elif signum == signal.SIGTERM:
                os.kill(self.pid, signum)
            else:
                os.killpg(self.pid, signum)
        except OSError:
            pass  # it ended meanwhile: its exit status is on the way
        if self.asking and signum == signal.SIGINT:
            raise KeyboardInterrupt  # out of the question being asked here

    def forward_signals(self) -> dict[int, Any]:
        """Forward what ``FORWARDED`` names (those ignored stay ignored); the handlers replaced."""
        return {sig: signal.signal(sig, self.forward) for sig in FORWARDED if signal.getsignal(sig) != signal.SIG_IGN}

    def wait(self) -> int | None:
        """Until the command ended: its exit code; ``None`` when the server did not start it."""
        import selectors

        with selectors.DefaultSelector() as sel:
            sel.register(self.sock, selectors.EVENT_READ, self.server)
            sel.register(self.ctl, selectors.EVENT_READ, self.asks)
            while True:
                for item, _ in sel.select():
                    lines: wire.Lines = item.data
                    for message in lines.feed():
                        done = self.answer(message) if lines is self.asks else self.hear(message)
                        if done is not None:
                            return done[0]
                    if lines.closed:
                        sel.unregister(item.fileobj)
                        if lines is self.server:
                            return self.lost()

    def hear(self, message: dict[str, Any]) -> tuple[int | None] | None:
        """A server line: ``(code,)`` when the command is over (``(None,)``: run it here)."""
        if message.get("stale") and self.pid is None:
            return (None,)
        if isinstance(message.get("pid"), int) and self.pid is None:
            self.pid = message["pid"]
            for signum in self.pending:
                self.forward(signum)
            self.pending.clear()
        elif isinstance(message.get("exit"), int):
            return (message["exit"],)
        elif isinstance(message.get("signal"), int):
            return (self.died_of(message["signal"]),)
        return None

    def answer(self, message: dict[str, Any]) -> None:
        """The command asks a yes/no question: ask it at this terminal, send the answer."""
        from orchestrator import ask

        self.asking = True
        try:
            answer = ask.confirm(str(message.get("ask", "")), bool(message.get("default")))
        except KeyboardInterrupt:  # Ctrl-C went to the command too (forward): it ends with 130
            answer = None
        finally:
            self.asking = False
        try:
            wire.send(self.ctl, {"answer": answer})
        except OSError:
            pass

    def died_of(self, signum: int) -> int:
        """Leave as the command did: by the same signal where it is one that ends a process."""
        if signum not in (signal.SIGSTOP, signal.SIGTSTP, signal.SIGCONT, signal.SIGCHLD):
            sys.stdout.flush()
            signal.signal(signum, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
            os.kill(os.getpid(), signum)
        return 128 + signum

    def lost(self) -> int | None:
        """The server went away: before the command started, run it here; after, say so."""
        if self.pid is None:
            return None
        sys.stderr.write("orch: lost the warm server that ran this command; its exit status is unknown\n")
        return 1


def spawn(where: wire.Place) -> None:
    """Start this environment's server in the background, detached from the terminal; nothing
    when one holds its lock (running, or starting). Never raises."""
    import subprocess

    from orchestrator.home import lock_free

    try:
        if not lock_free(where.lock):
            return
        src = str(wire.ORCH_SOURCE)
        code = (f"import sys; p = {src!r}; p in sys.path or sys.path.insert(0, p); "
                "from orchestrator.warm import server; server.main()")
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, cwd="/")
    except (OSError, ValueError):
        pass


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _t0() -> float:
    """When this process started on the monotonic clock all processes share: the command's
    ``ORCH_TRACE`` times count from the client's start."""
    return time.monotonic() - trace.process_age_s()

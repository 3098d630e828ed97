"""``orch``'s entry point: hand the command to the warm server, or run it here.

For the commands in ``wire.WARM_COMMANDS`` the client connects to this environment's warm
server and passes it the argv, the working folder, the environment and the umask; the server
forks a process, which gets the terminal (descriptors 0, 1, 2) from the client once the client
has its pid, and runs the command; the client waits and exits with its exit code (or the
signal that ended it). Meanwhile it forwards
what a terminal sends it — Ctrl-C (SIGINT), SIGQUIT, SIGHUP, SIGWINCH and SIGCONT to the
command's process group, SIGTERM to the command — and at a Ctrl-Z (SIGTSTP) it stops the
command, then itself, as a shell expects. Questions the command asks (``orchestrator.ask``) are
asked here, where the terminal is. A client killed outright (SIGKILL) takes its command with it:
the command sees its end of the socket pair close and kills its process group (so does the
server, seeing the connection close). A server that answers nothing within ``wire.ANSWER_S``
(stopped, hung) is bypassed: the command runs here, said in one line, and a Ctrl-C or SIGTERM
before the command started ends the client at once; a server that dies while the command runs
has the command stopped (``Session``).

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
    from typing import Any, Callable

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
    sock.settimeout(wire.ANSWER_S)  # a stopped server's full backlog blocks a connect
    try:
        sock.connect(str(where.sock))
    except socket.timeout:
        sock.close()
        _say_bypassed()
        return None
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
                socket.send_fds(sock, [b"F"], [theirs.fileno()])
                wire.send(sock, request)
            except socket.timeout:
                _say_bypassed()
                return None
            except OSError:
                return None
            finally:
                theirs.close()
            return session.wait()
        except GiveUp as given:  # Ctrl-C or SIGTERM before the command started: nothing ran there
            mine.close()  # a command forked meanwhile sees its client gone and never starts
            return session.died_of(given.signum)
        finally:
            session.open = False
            for sig, handler in replaced.items():
                signal.signal(sig, handler)
            for sig in session.late:  # a Ctrl-Z as the session closed: to the command as it runs here
                os.kill(os.getpid(), sig)


# Signals that end a process: before the server has the command started, the client gives up
# on it and ends at once as the signal ends a process (never queued behind a silent server).
ENDING = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM)
STOP_S = 10.0  # the server lost: how long the command has to stop at its Ctrl-C before SIGKILL


class GiveUp(Exception):
    """An ending signal arrived before the command started (``ENDING``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Session:
    """One command on the server: its pid, the signals to forward, the questions to ask.

    The pid must come within ``wire.ANSWER_S`` (else the command runs here: a stopped or hung
    server is bypassed); only then does the command hear ``go``. From then on what the command
    itself says on the socket pair (its exit code, or its end) is enough to finish: a server
    that stops meanwhile holds nothing up. A server that dies while the command runs is a
    command without its server: it is stopped as a Ctrl-C stops it (SIGKILL after ``STOP_S``),
    and this client exits once it ended — nothing of it runs on to surprise a rerun."""

    def __init__(self, sock: socket.socket, ctl: socket.socket) -> None:
        self.sock, self.ctl = sock, ctl
        self.server, self.asks = wire.Lines(sock), wire.Lines(ctl)
        self.pid: int | None = None
        self.pending: list[int] = []
        self.asking = False
        self.verdict: tuple[int | None] | None = None  # the server's word: (code,), (None,): run here
        self.exit: int | None = None  # the command's own word on its exit code
        self.ending: int | None = None  # the last ending signal forwarded to the command
        self.sel: Any = None
        self.open = True  # GiveUp may be raised (the session's code is ready for it)
        self.late: list[int] = []  # arrived as the session closed, before the handlers were restored

    def forward(self, signum: int, _frame: Any = None) -> None:
        if self.pid is None:
            if signum in ENDING and not self.open:
                self.died_of(signum)  # the session is over and nothing runs yet: end here as the signal ends orch
            elif not self.open:
                self.late.append(signum)
            elif signum in ENDING:
                raise GiveUp(signum)
            else:
                self.pending.append(signum)
            return
        if signum in ENDING and signum != signal.SIGINT:
            self.ending = signum  # the command may die of it, without a word of its own
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
            self.sel = sel
            sel.register(self.sock, selectors.EVENT_READ, self.server)
            sel.register(self.ctl, selectors.EVENT_READ, self.asks)
            self.pump(lambda: self.pid is not None or self.verdict is not None or self.server.closed, wire.ANSWER_S)
            if self.verdict is not None:
                return self.verdict[0]
            if self.pid is None:
                if not self.server.closed:
                    _say_bypassed()
                return None  # a server that closed before it started the command: run it here
            self.pump(lambda: self.verdict is not None or self.server.closed or self.asks.closed, None)
            if self.verdict is not None:
                return self.verdict[0]
            if self.asks.closed:
                return self.ended()
            return self.lost()

    def pump(self, until: Callable[[], bool], timeout: float | None) -> bool:
        """Read both sockets and act on what they say until ``until()`` holds (True) or
        ``timeout`` seconds passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not until():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            for item, _ in self.sel.select(left):
                lines: wire.Lines = item.data
                for message in lines.feed():
                    if lines is self.asks:
                        self.said(message)
                    else:
                        self.hear(message)
                if lines.closed:
                    self.sel.unregister(item.fileobj)
        return True

    def hear(self, message: dict[str, Any]) -> None:
        """A server line: the pid (then ``go``), or how the command ended, or ``stale``."""
        if message.get("stale") and self.pid is None:
            self.verdict = (None,)
        elif isinstance(message.get("pid"), int) and self.pid is None and self.verdict is None:
            try:  # the terminal goes to the command only now: never left with a server that is stopped
                socket.send_fds(self.ctl, [b'{"go": true}\n'], [0, 1, 2])
            except OSError:
                pass  # it is gone already: the server says how it ended
            self.pid = message["pid"]
            for signum in self.pending:
                self.forward(signum)
            self.pending.clear()
        elif isinstance(message.get("exit"), int):
            self.verdict = (message["exit"],)
        elif isinstance(message.get("signal"), int):
            self.verdict = (self.died_of(message["signal"]),)

    def said(self, message: dict[str, Any]) -> None:
        """A line of the command's: a question to ask here, or its exit code."""
        if "ask" in message:
            self.answer(message)
        elif isinstance(message.get("exit"), int) and self.pid is not None:
            self.exit = message["exit"]

    def ended(self) -> int:
        """The command ended (its end of the pair closed): its own exit code; else (a signal
        ended it) the server's word, or the ending signal this client forwarded."""
        if self.exit is not None:
            return self.exit
        if self.ending is not None:
            return self.died_of(self.ending)
        self.pump(lambda: self.verdict is not None or self.server.closed, wire.ANSWER_S)
        if self.verdict is not None:
            return self.verdict[0]  # type: ignore[return-value]
        sys.stderr.write("orch: the command ended and the warm server did not say how; its exit status is unknown\n")
        return 1

    def lost(self) -> int:
        """The server died while the command ran: stop the command as Ctrl-C stops it, wait
        until it ended (SIGKILL after ``STOP_S``), say so; the command's exit code."""
        assert self.pid is not None
        try:
            os.killpg(self.pid, signal.SIGINT)
        except OSError:  # it had ended already: its own word is on the way
            self.pump(lambda: self.asks.closed, wire.ANSWER_S)
            return self.exit if self.exit is not None else 1
        if not self.pump(lambda: self.asks.closed, STOP_S):
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
            self.pump(lambda: self.asks.closed, wire.ANSWER_S)
        sys.stderr.write("orch: lost the warm server that ran this command, so the command was stopped as Ctrl-C "
                         "stops it; nothing of it runs on: run it again\n")
        return self.exit if self.exit is not None else 1

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


def _say_bypassed() -> None:
    sys.stderr.write(f"orch: the warm server did not answer within {wire.ANSWER_S:.0f} s (stopped or hung?); "
                     "running this command in its own process (ORCH_WARM=0 always does)\n")
    sys.stderr.flush()


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

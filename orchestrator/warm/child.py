"""A command's process on the warm server: fork's child becomes the process the client would
have been — its terminal, folder, environment, umask and signal dispositions — and runs the
command as ``orch`` would (``orchestrator.cli.main``).

It leads a process group of its own, which the client signals as a terminal signals its
foreground group (so ssh and other programs the command starts get a Ctrl-C as they would). It
is not in the terminal's foreground group: a terminal on standard input becomes ``/dev/null``
(a read would stop the process), and ``orchestrator.ask`` questions go to the client.

Contracts (``ClientLink``, on the socket pair shared with the client alone):
- the command starts only once its client said ``go`` (it has the pid, within its bound): a
  client that gave up on the server (``wire.ANSWER_S``, a Ctrl-C) never has its command run
  here as well as in its own process;
- it never outlives its client: when the client's end closes — the client killed, or gone
  because the server died — the command's process group is killed (SIGKILL), as the client's
  death would have killed the command in its own process; this needs no server (a
  parent-death signal that works on macOS too);
- the environment is the client's, applied as a process that starts with it has it: the time
  zone (``TZ``) is read again (``time.tzset``); the rest is read where it is used
  (``COLUMNS``, ``NO_COLOR``, ...) or keys the server (``wire.key``: the locale's variables).
"""

from __future__ import annotations

import io
import os
import queue
import signal
import socket
import sys
import threading
import time
from typing import Any

from orchestrator import ask, settings, trace
from orchestrator.warm import wire

RESET = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP, signal.SIGCONT, signal.SIGWINCH,
         signal.SIGCHLD, signal.SIGTTIN, signal.SIGTTOU, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)


def run(request: dict[str, Any], link: ClientLink) -> int:
    """Become the client's process and, once the client says ``go`` (handing its descriptors 0,
    1 and 2 over with it), run its command; the exit code (nothing runs when the client is gone
    first)."""
    os.setpgid(0, 0)
    signal.set_wakeup_fd(-1)
    for sig in RESET:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in request["ignored"]:
        signal.signal(sig, signal.SIG_IGN)
    os.environ.clear()
    os.environ.update(request["env"])
    if hasattr(time, "tzset"):
        time.tzset()  # the C library read TZ when the server started: the client's zone now
    os.umask(request["umask"])
    os.chdir(request["cwd"])
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])  # a Ctrl-C from now on: where it can be said
    fds = link.wait_go()
    if fds is None:
        return 0  # the client gave up on this server: nobody hears this, nothing ran
    stdin = fds[0]
    if os.isatty(stdin):
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.close(fds[0])
    for target, fd in zip((0, 1, 2), (stdin, fds[1], fds[2])):
        os.dup2(fd, target)
    for fd in {stdin, fds[1], fds[2]} - {0, 1, 2}:
        os.close(fd)
    _standard_streams()
    sys.argv = ["orch", *request["argv"]]
    trace.restart(request["t0"], settings.TRACE.raw())
    trace.mark("warm", f"forked by the warm server {os.getppid()}")
    ask.relay = link.confirm
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
        from orchestrator.cli.main import main

        main(list(request["argv"]))
        code: Any = 0
    except SystemExit as done:
        code = done.code
    except KeyboardInterrupt:  # a Ctrl-C before the command's own handling began
        print("\ninterrupted", file=sys.stderr)
        code = 130
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


class ClientLink:
    """The command's end of the socket pair its client holds the other end of (module
    docstring): ``go`` with the client's descriptors 0-2, then — read by a thread — the answers
    to questions, and its end: the client is gone, and the command's process group is killed
    unless the command already ended."""

    def __init__(self, ctl: socket.socket) -> None:
        self.ctl = ctl
        self.ended = False  # the command is over (``report``): the client closing is no news
        self.answers: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def wait_go(self) -> list[int] | None:
        """Until the client said ``go``: its descriptors 0, 1, 2 (and the thread that watches
        the client started); ``None`` when the client is gone first (or sent anything else)."""
        lines = wire.Lines(self.ctl)
        try:
            lines.buf, fds, _, _ = socket.recv_fds(self.ctl, 4096, 3)  # the descriptors come with go's first byte
        except OSError:
            return None
        message = lines.next() if len(fds) == 3 else None
        if message is None or message.get("go") is not True:
            for fd in fds:
                os.close(fd)
            return None
        threading.Thread(target=self._listen, args=(lines,), name="orch-warm-client-link", daemon=True).start()
        return fds

    def _listen(self, lines: wire.Lines) -> None:
        while (message := lines.next()) is not None:
            if "answer" in message:
                self.answers.put(message)
        self.answers.put(None)
        if not self.ended:
            _kill_own_group()

    def confirm(self, question: str, default: bool) -> bool | None:
        """``orchestrator.ask``'s relay: the question asked at the client's terminal."""
        wire.send(self.ctl, {"ask": question, "default": default})
        reply = self.answers.get()
        if reply is None:
            raise KeyboardInterrupt
        answer = reply.get("answer")
        return answer if isinstance(answer, bool) else None

    def report(self, code: int) -> None:
        """Tell the client how the command ended, itself: the client needs no server for it (a
        stopped or dead server cannot hold its exit up)."""
        self.ended = True
        try:
            wire.send(self.ctl, {"exit": code})
        except OSError:
            pass


def _kill_own_group() -> None:
    """SIGKILL to this command's process group (to this process alone should it not lead one:
    never the server's group)."""
    me = os.getpid()
    try:
        if os.getpgrp() == me:
            os.killpg(me, signal.SIGKILL)
        os.kill(me, signal.SIGKILL)
    except OSError:
        pass


def finish() -> None:
    """What the interpreter does at its exit before it tears down: join the threads that are
    not daemons, run the atexit functions, flush the standard streams."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _standard_streams() -> None:
    """sys.stdin/stdout/stderr anew on descriptors 0-2, as Python makes them at its start:
    stdout line-buffered on a terminal, stderr always; ``PYTHONUNBUFFERED`` writes through. The
    encodings and error handlers are the server's, which depend only on the environment
    variables that key it (``wire.key``)."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED")) or bool(sys.flags.unbuffered)
    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        encoding = getattr(old, "encoding", None) or "utf-8"
        errors = getattr(old, "errors", None) or "strict"
        if fd == 0:
            stream = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=encoding,
                                      errors=errors)
        else:
            stream = io.TextIOWrapper(io.BufferedWriter(io.FileIO(fd, "w", closefd=False)), encoding=encoding,
                                      errors=errors, line_buffering=fd == 2 or os.isatty(fd),
                                      write_through=unbuffered)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)

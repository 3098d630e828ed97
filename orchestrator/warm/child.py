"""A command's process on the warm server: fork's child becomes the process the client would
have been — its terminal, folder, environment, umask and signal dispositions — and runs the
command as ``orch`` would (``orchestrator.cli.main``).

It leads a process group of its own, which the client signals as a terminal signals its
foreground group (so ssh and other programs the command starts get a Ctrl-C as they would). It
is not in the terminal's foreground group: a terminal on standard input becomes ``/dev/null``
(a read would stop the process), and ``orchestrator.ask`` questions go to the client.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import sys
from typing import Any

from orchestrator import ask, settings, trace
from orchestrator.warm import wire

RESET = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP, signal.SIGCONT, signal.SIGWINCH,
         signal.SIGCHLD, signal.SIGTTIN, signal.SIGTTOU, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)


def run(request: dict[str, Any], fds: list[int], ctl: socket.socket) -> int:
    """Become the client's process and run its command; the exit code."""
    os.setpgid(0, 0)
    signal.set_wakeup_fd(-1)
    for sig in RESET:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in request["ignored"]:
        signal.signal(sig, signal.SIG_IGN)
    stdin = fds[0]
    if os.isatty(stdin):
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.close(fds[0])
    for target, fd in zip((0, 1, 2), (stdin, fds[1], fds[2])):
        os.dup2(fd, target)
    for fd in {stdin, fds[1], fds[2]} - {0, 1, 2}:
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.umask(request["umask"])
    os.chdir(request["cwd"])
    _standard_streams()
    sys.argv = ["orch", *request["argv"]]
    trace.restart(request["t0"], settings.TRACE.raw())
    trace.mark("warm", f"forked by the warm server {os.getppid()}")
    ask.relay = _relay(ctl)
    from orchestrator.cli.main import main

    try:
        main(list(request["argv"]))
        code: Any = 0
    except SystemExit as done:
        code = done.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


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


def _relay(ctl: socket.socket) -> ask.Relay:
    """``orchestrator.ask``'s questions, asked by the client at its terminal."""
    lines = wire.Lines(ctl)

    def confirm(question: str, default: bool) -> bool | None:
        wire.send(ctl, {"ask": question, "default": default})
        reply = lines.next()
        if reply is None:
            raise KeyboardInterrupt
        answer = reply.get("answer")
        return answer if isinstance(answer, bool) else None

    return confirm

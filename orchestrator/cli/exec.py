"""``orch exec HOST -- CMD...``: one command on a host, output streamed, its exit code kept."""

from __future__ import annotations

import sys
import threading
import time

import click

from orchestrator import shell
from orchestrator.cli.app import App, pass_app
from orchestrator.connect import never, open_transport
from orchestrator.errors import UsageError
from orchestrator.termtext import CleanDecoder
from orchestrator.transport.base import Process


def _pump_stdin(proc: Process) -> None:
    try:
        while chunk := sys.stdin.buffer.read1(65536):
            proc.write(chunk)
    except (OSError, ValueError):
        pass
    finally:
        proc.close_stdin()


def _pump_stderr(proc: Process, done: threading.Event) -> None:
    """Copy the command's stderr to ours as it arrives (the transport collects it)."""
    decoder, sent = CleanDecoder(), 0
    while True:
        finished = done.is_set()
        err = proc.stderr
        if len(err) > sent:
            sys.stderr.write(decoder.feed(err[sent:]))
            sys.stderr.flush()
            sent = len(err)
        if finished:
            sys.stderr.write(decoder.feed(b"", final=True))
            return
        time.sleep(0.05)


def run_streaming(proc: Process, forward_stdin: bool) -> int:
    """Stream stdout (raw bytes) and stderr (cleaned text) until the command exits; its code."""
    if forward_stdin:
        threading.Thread(target=_pump_stdin, args=(proc,), daemon=True).start()
    else:
        proc.close_stdin()
    done = threading.Event()
    err_thread = threading.Thread(target=_pump_stderr, args=(proc, done), daemon=True)
    err_thread.start()
    try:
        while chunk := proc.read():
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
        code = proc.wait()
    finally:
        done.set()
        err_thread.join(timeout=5)
    return code


@click.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("host_name", metavar="HOST")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD...")
@pass_app
def exec_cmd(app: App, host_name: str, argv: tuple[str, ...]) -> None:
    """Run one command on HOST (through its login shell) and exit with its exit code.

    The words after `--` are passed as they are (through a login shell on SSH hosts, so
    conda's PATH is there): no shell re-splits them. Piped stdin is forwarded.

    \b
    Examples:
      orch exec box -- nvidia-smi
      orch exec box -- python -c "import torch; print(torch.__version__)"
    """
    words = list(argv[1:] if argv[:1] == ("--",) else argv)
    if not words:
        raise UsageError("nothing to run: orch exec HOST -- CMD ...")
    host = app.inventory.get(host_name)
    argv = words if host.kind == "local" else shell.login_argv(words)  # conda's PATH, like the job
    with open_transport(host, app.inventory, never) as transport:
        code = run_streaming(transport.start(argv), forward_stdin=not sys.stdin.isatty())
    raise SystemExit(code)


COMMANDS = [exec_cmd]

"""``orch exec HOST -- CMD...``: one command on a host, output streamed, its exit code kept."""

from __future__ import annotations

import sys
import threading
import time

import click

from orchestrator.access.connect import open_transport
from orchestrator.cli.app import App, pass_app
from orchestrator.errors import UsageError
from orchestrator.home import orch_home
from orchestrator.state import fences
from orchestrator.termtext import CleanDecoder
from orchestrator.transport import shell
from orchestrator.transport.base import Process, never


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


def _not_found_hint(host: str, words: list[str]) -> str:
    return (f"{host}: exit 127: {words[0]!r} was not found? To run a shell command line (a pipe, ;, &&, "
            f"a redirection, $VAR), pass it as ONE quoted argument: orch exec {host} -- 'nvidia-smi | head'")


@click.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("host_name", metavar="HOST")
@click.argument("argv", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- CMD...")
@pass_app
def exec_cmd(app: App, host_name: str, argv: tuple[str, ...]) -> None:
    """Run one command on HOST (through its login shell) and exit with its exit code.

    \b
    Two forms:
      several arguments, or one plain word: a program and its arguments, passed on
        exactly as they are (no shell re-splits or expands them)
      ONE argument with shell syntax (spaces, |, ;, &&, >, $, quotes, ...): a shell
        command line, run with `bash -c` (on SSH hosts `bash -lc`, so conda's PATH is there)
    Piped stdin is forwarded.

    \b
    Examples:
      orch exec box -- nvidia-smi
      orch exec box -- 'nvidia-smi | head -n 15'
      orch exec box -- 'cd /root/autodl-tmp && du -sh * > sizes.txt'
      orch exec box -- python -c "import torch; print(torch.__version__)"
    """
    words = list(argv[1:] if argv[:1] == ("--",) else argv)
    if not words:
        raise UsageError("nothing to run: orch exec HOST -- CMD ...")
    host = app.inventory.get(host_name)
    local = host.kind == "local"
    with open_transport(host, app.inventory, never) as transport:
        if fences.pending(orch_home() / "registry.db", host=host.name):  # a moved job's old attempt here stops first
            from orchestrator.helper.fence import settle_on
            from orchestrator.helper.remote import Remote

            settle_on(Remote(host, transport), app.say)
        try:
            proc = transport.start(shell.user_argv(words, local))
        except FileNotFoundError:  # local: no such program (an SSH host's shell says so itself)
            print(f"{words[0]}: not found", file=sys.stderr)
            proc = None
        code = 127 if proc is None else run_streaming(proc, forward_stdin=not sys.stdin.isatty())
    if code == 127 and not shell.is_shell_line(words):
        app.say(_not_found_hint(host_name, words))
    raise SystemExit(code)


COMMANDS = [exec_cmd]

"""``orch``: the click group, and the one place that maps errors to messages and exit codes.

Exit codes: 0 success · 1 the job failed · 2 invalid input (a broken file of the laptop's
included: ``LocalFileError``) · 3 cannot reach or authenticate to a host · 4 a remote step
failed · 130 interrupted. Tracebacks only with ``ORCH_DEBUG=1``.

Background threads (stderr drains, stdin pumps, the SSH watchdog, the sync writer, paramiko's
transport) never print either: ``threading.excepthook`` records the first exception a thread
dies of and prints nothing, and paramiko's log (which prints tracebacks of its own thread) goes
nowhere. The main flow meets the same cause (the connection is lost, a file cannot be read) and
reports it as usual; only a thread that died of a bug — not an ``OrchError``, ``OSError``,
``EOFError`` or paramiko error — adds one warning line at the end, the exit code unchanged.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

import click

from orchestrator import __version__
from orchestrator.cli import cancel, check, exec, fetch, hosts, logs, plot, resume, show, status, submit, vscode
from orchestrator.errors import OrchError
from orchestrator.termtext import clean

EPILOG = """\b
Examples:
  orch hosts add box --ssh "ssh -p 23456 root@region-9.example.com" --trust
  orch check jobs/tiny-lora-local.yaml
  orch submit jobs/tiny-lora-local.yaml --follow
  orch status -w
  orch logs JOB -f
  orch plot JOB
  orch fetch JOB
  orch cancel JOB
  orch hosts check box
  orch code box --workspace .
  orch exec box -- nvidia-smi
"""


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="orch")
def cli() -> None:
    """Run fine-tuning jobs on rented SSH GPU servers from your laptop."""


for module in (check, submit, status, logs, cancel, fetch, resume, show, hosts, vscode, exec, plot):
    for command in module.COMMANDS:
        cli.add_command(command)


THREAD_FAILURES: list[tuple[str, BaseException]] = []  # (thread name, exception): the first only


def record_thread_failure(args: threading.ExceptHookArgs) -> None:
    """``threading.excepthook``: keep the first exception a thread died of; print nothing."""
    if args.exc_value is None or isinstance(args.exc_value, SystemExit) or THREAD_FAILURES:
        return
    THREAD_FAILURES.append((args.thread.name if args.thread is not None else "?", args.exc_value))


def expected_in_a_thread(exc: BaseException) -> bool:
    """A failure the main flow meets too (a lost connection, an OS error), so it reports it."""
    return isinstance(exc, (OrchError, OSError, EOFError)) or type(exc).__module__.split(".")[0] == "paramiko"


def quiet_threads() -> None:
    """No background thread prints a traceback (module docstring); ``ORCH_DEBUG=1`` keeps them."""
    threading.excepthook = record_thread_failure
    logging.getLogger("paramiko").addHandler(logging.NullHandler())


def report_thread_failure() -> None:
    """One warning line for a thread that died of a bug; nothing for an expected failure."""
    if THREAD_FAILURES and not expected_in_a_thread(THREAD_FAILURES[0][1]):
        name, exc = THREAD_FAILURES[0]
        click.echo(f"warning: background thread {name} stopped: {type(exc).__name__}: {exc} "
                   "(set ORCH_DEBUG=1 for a traceback)", err=True)


def main(argv: list[str] | None = None) -> None:
    debug = os.environ.get("ORCH_DEBUG") == "1"
    if not debug:
        quiet_threads()
    try:
        _run(argv, debug)
    finally:
        report_thread_failure()


def _run(argv: list[str] | None, debug: bool) -> None:
    try:
        cli.main(args=argv, prog_name="orch", standalone_mode=False)
    except OrchError as exc:
        if debug:
            raise
        click.echo(f"error: {clean(str(exc))}", err=True)  # messages may carry server text
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if exc.exit_code in (1, 2) else exc.exit_code)
    except KeyboardInterrupt:
        click.echo("\ninterrupted", err=True)
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # a bug: say so plainly, trace only on request
        if debug:
            raise
        click.echo(f"internal error: {type(exc).__name__}: {clean(str(exc))}\n(set ORCH_DEBUG=1 for a traceback)", err=True)
        sys.exit(4)
    sys.exit(0)


if __name__ == "__main__":
    main()

"""``orch``: the click group, and the one place that maps errors to messages and exit codes.

The group is lazy (``LazyGroup``): a command's module is imported only when that command runs,
and ``orch --help`` lists the commands from a static table (``COMMAND_TABLE``), so starting ``orch``
costs click and this module, not pydantic, rich or paramiko. The garbage collector does not
walk what the imports made: off while a command's module imports, that is frozen after, and so
is everything as the process ends (measured: 20-60 ms of collections during a submit's imports,
0.1-0.5 s of them at exit, on a loaded machine).

Exit codes: 0 success · 1 the job failed · 2 invalid input (a broken file of the laptop's
included: ``LocalFileError``) · 3 cannot reach or authenticate to a host · 4 a remote step
failed · 130 interrupted. Tracebacks only with ``ORCH_DEBUG=1``. Every ``ORCH_*`` setting is
checked before the command runs (``settings.check_all``: an unreadable one is exit 2).

Background threads (stderr drains, stdin pumps, the SSH watchdog, the sync writer, paramiko's
transport) never print either: ``threading.excepthook`` records the first exception a thread
dies of and prints nothing, and paramiko's log (which prints tracebacks of its own thread) goes
nowhere. The main flow meets the same cause (the connection is lost, a file cannot be read) and
reports it as usual; only a thread that died of a bug — not an ``OrchError``, ``OSError``,
``EOFError`` or paramiko error — adds one warning line at the end, the exit code unchanged.
"""

from __future__ import annotations

import gc
import importlib
import logging
import sys
import threading
import warnings
from gettext import gettext as _

import click

from orchestrator import __version__, settings, trace
from orchestrator.errors import Interrupted, OrchError
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

# Every command: its module under orchestrator.cli (which lists it in COMMANDS) and the first
# paragraph of its help, whitespace collapsed — what `orch --help` shortens to one line, so the
# module is imported only when the command runs. tests/orchestrator/cli/test_cli_start.py checks this table
# against the real commands (names, modules, help), so it cannot drift.
COMMAND_TABLE: dict[str, tuple[str, str]] = {
    "down": ("provision", "Power a provider host off and wait until the provider says it is off (billing stops)."),
    "cancel": ("cancel", "Stop a job on every node: SIGTERM to all its processes (the trainer checkpoints), "
                         "SIGKILL to what is left after the grace period."),
    "check": ("check", "Validate a job file; exit 2 with file:line:column and the field when it is invalid, "
                       "when the workspace folder is missing, or when launch.command runs a workspace file that "
                       "will not be synced (missing, or excluded: the message names the ignore rule). With "
                       "--remote, also check each host can run it (exit 4 on a blocker); on a host with no GPU it names "
                       "what the command leaves to its framework that may need one (TRL's bf16 default, "
                       "accelerate's host config, torchtune's device: cuda) and the flags for the CPU."),
    "controller": ("controller", "Run the managed-jobs controller on a host that stays on (docs/managed.md)."),
    "code": ("vscode", "Open the host's synced workspace (or JOB's code snapshot) in VSCode Remote-SSH."),
    "exec": ("exec", "Run one command on HOST (through its login shell) and exit with its exit code."),
    "fetch": ("fetch", "Download what the job's `outputs` select, verified by sha256; idempotent."),
    "gc": ("gc", "Remove what orch keeps on HOST that nothing needs any more, and say what it frees."),
    "hosts": ("hosts", "Manage the host inventory (`local` is built in)."),
    "instances": ("instances", "List every instance each provider account holds, with state, price and age, "
                               "marking those no host entry names (\"billing, unknown to orch\" when they bill), "
                               "and the command that adds, powers off or releases each."),
    "logs": ("logs", "Print a job's log; with -f follow it until the job ends."),
    "ls": ("status", "List all jobs (same as `orch status`)."),
    "plot": ("plot", "Draw loss (train and eval), lr and tokens/s against step into a PNG."),
    "queue": ("queue", "Show each host's GPU queue: its GPUs, the running jobs with their GPUs, and the waiting ones "
                       "with their place, priority, what they need and since when."),
    "rm": ("rm", "Remove a finished job's folder on its host (every node's), keeping its record here."),
    "rerun": ("show", "Run a job again as a new job: the same recorded spec and the same code snapshot."),
    "release": ("provision", "Give a provider host's instance back for good (AutoDL: a powered-off one; vast, "
                             "RunPod: destroyed in any state; its disks are deleted) and remove the host entry. Asks "
                             "first; --yes for scripts."),
    "rent": ("rent", "Rent a GPU instance on vast.ai or RunPod (search offers, show the best one and its price) or an "
                     "AutoDL Pro instance (the GPU specification, image and region you name), create it after a yes "
                     "(or --yes), wait until SSH answers, and add it as a host."),
    "resume": ("resume", "Relaunch a failed, lost or cancelled job (--on HOST: on another host); the built-in trainer "
                         "continues from its latest complete checkpoint."),
    "schema": ("check", "Print the JSON Schema of job.yaml (for editors: yaml-language-server)."),
    "show": ("show", "What a job ran with: its spec as written, the git commit and diff of the workspace, the "
                     "remote python / torch / CUDA / GPUs and pip freeze."),
    "spend": ("spend", "Show this month's cost of orch's jobs per host and per provider (from the laptop's "
                       "records: prices and run times) and each provider account's balance where it reports one."),
    "ssh": ("vscode", "Open a shell on HOST with the system `ssh` (pinned host key, orch's settings)."),
    "ssh-config": ("vscode", "Print (or --write) the `Host orch-<name>` block for every inventory host."),
    "status": ("status", "Show jobs: state, nodes, step/total, loss, tokens/s, ETA, elapsed, and a cost "
                         "estimate for hosts with a price (orch hosts add ... --price-per-hour)."),
    "submit": ("submit", "Validate, sync the workspace, set up and launch a job."),
    "tunnel": ("tunnel", "Forward local ports to a box through orch's own SSH connection, and print the local URLs."),
    "up": ("provision", "Power a provider host on and wait until SSH answers (credentials re-read on each try)."),
}


class LazyGroup(click.Group):
    """A click group whose commands are imported when they run (``COMMAND_TABLE``), not when
    ``orch`` starts: ``orch --help`` lists every command from the table alone, and
    ``orch status`` loads only what ``status`` needs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMAND_TABLE})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command ``cmd_name``, importing its module; None for an unknown name."""
        command = super().get_command(ctx, cmd_name)
        if command is not None or cmd_name not in COMMAND_TABLE:
            return command
        gc.disable()  # imports make many objects and little garbage: no collection pass over them,
        try:  # and none later either (frozen: a command's own collections look at its own objects)
            module = importlib.import_module(f"orchestrator.cli.{COMMAND_TABLE[cmd_name][0]}")
        finally:
            gc.freeze()
            gc.enable()
        trace.mark("imports", f"orchestrator.cli.{COMMAND_TABLE[cmd_name][0]} and what it imports")
        return next(c for c in module.COMMANDS if c.name == cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """What ``click.Group.format_commands`` writes, from the table: no command imported."""
        names = self.list_commands(ctx)
        stand_ins = {name: click.Command(name, help=COMMAND_TABLE[name][1]) if name in COMMAND_TABLE
                     else super().get_command(ctx, name) for name in names}
        rows = [(name, cmd) for name, cmd in stand_ins.items() if cmd is not None and not cmd.hidden]
        if rows:
            limit = formatter.width - 6 - max(len(name) for name, _ in rows)
            with formatter.section(_("Commands")):
                formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in rows])


@click.group(cls=LazyGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="orch")
def cli() -> None:
    """Run fine-tuning jobs on rented SSH GPU servers from your laptop."""


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
    if trace.ON:  # ORCH_TRACE: a line per phase (orchestrator/trace.py)
        words = (argv if argv is not None else sys.argv[1:])[:1]
        trace.mark("cli start", f"orch {' '.join(words)} at {trace.wall_clock()}")
    debug = bool(settings.DEBUG.lenient())
    if not debug:
        quiet_threads()
    try:
        _run(argv, debug)
    except SystemExit as done:
        trace.mark("exit", f"code {done.code}")
        raise
    finally:
        report_thread_failure()
        # The process ends here. Python's last garbage collections walk every object the
        # imports made (pydantic's schemas, typing's caches): 0.1-0.5 s measured before the
        # shell prompt came back. Frozen, they are left to the exit; atexit handlers, thread
        # joins and the flush of stdout/stderr still run as usual.
        gc.freeze()


def say_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                file: object = None, line: str | None = None) -> None:
    """``warnings.showwarning`` for a command: orch's own warnings (a renamed setting) as one
    ``warning:`` line on stderr, like every other; anyone else's as Python shows them."""
    if issubclass(category, settings.RenamedSetting):
        click.echo(f"warning: {message}", err=True)
    else:
        _SHOW_WARNING(message, category, filename, lineno, file, line)  # type: ignore[arg-type]


_SHOW_WARNING = warnings.showwarning


def _run(argv: list[str] | None, debug: bool) -> None:
    warnings.showwarning = say_warning
    try:
        settings.check_all()  # an unreadable ORCH_* value: exit 2 before anything starts
        cli.main(args=argv, prog_name="orch", standalone_mode=False)
    except OrchError as exc:
        if debug:
            raise
        click.echo(f"error: {clean(str(exc))}", err=True)  # messages may carry server text
        sys.exit(exc.exit_code)
    except click.exceptions.Abort as exc:  # click's word for a KeyboardInterrupt (its cause) in a command
        kept = str(exc.__cause__) if isinstance(exc.__cause__, Interrupted) else ""
        click.echo("interrupted" + (f": {clean(kept)}" if kept else ""), err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if exc.exit_code in (1, 2) else exc.exit_code)
    except KeyboardInterrupt as exc:  # errors.Interrupted says what the step kept
        kept = str(exc) if isinstance(exc, Interrupted) else ""
        click.echo("\ninterrupted" + (f": {clean(kept)}" if kept else ""), err=True)
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

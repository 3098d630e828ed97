"""``orch``: the click group, and the one place that maps errors to messages and exit codes.

Exit codes: 0 success · 1 the job failed · 2 invalid input · 3 cannot reach or authenticate
to a host · 4 a remote step failed · 130 interrupted. Tracebacks only with ``ORCH_DEBUG=1``.
"""

from __future__ import annotations

import os
import sys

import click

from orchestrator import __version__
from orchestrator.cli import cancel, check, exec, fetch, hosts, logs, plot, resume, show, status, submit, vscode
from orchestrator.errors import OrchError

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


def main(argv: list[str] | None = None) -> None:
    debug = os.environ.get("ORCH_DEBUG") == "1"
    try:
        cli.main(args=argv, prog_name="orch", standalone_mode=False)
    except OrchError as exc:
        if debug:
            raise
        click.echo(f"error: {exc}", err=True)
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
        click.echo(f"internal error: {type(exc).__name__}: {exc}\n(set ORCH_DEBUG=1 for a traceback)", err=True)
        sys.exit(4)
    sys.exit(0)


if __name__ == "__main__":
    main()

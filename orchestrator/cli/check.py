"""``orch check`` and ``orch schema``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import click

from orchestrator.checks import gpudefaults
from orchestrator.checks.laptop import laptop_report
from orchestrator.checks.preflight import Needs, preflight_hosts
from orchestrator.checks.verdict import table
from orchestrator.cli.app import App, pass_app
from orchestrator.jobs import launchconfig
from orchestrator.errors import SpecError
from orchestrator.plan import hidden, launchers
from orchestrator.plan.slurm import check_hosts
from orchestrator.spec.load import load_spec
from orchestrator.spec.model import JobSpec


@click.command("check")
@click.argument("spec_file", type=click.Path(path_type=Path))
@click.option("--remote", is_flag=True, help="Also preflight each host (GPUs, torch, disk, ...) for this job.")
@pass_app
def check_cmd(app: App, spec_file: Path, remote: bool) -> None:
    """Validate a job file; exit 2 with file:line:column and the field when it is invalid,
    when the workspace folder is missing, or when launch.command runs a workspace file that
    will not be synced (missing, or excluded: the message names the ignore rule).
    With --remote, also check each host can run it (exit 4 on a blocker); on a host with no
    GPU it names what the command leaves to its framework that may need one (TRL's bf16
    default, accelerate's host config, torchtune's device: cuda) and the flags for the CPU.

    An excluded file's message also gives the .orchignore line that brings it back. Warnings
    (exit 0): files or folders the command's arguments name that will not be synced or are
    not in the workspace, and outputs: that orch fetch would miss.

    \b
    Examples:
      orch check jobs/tiny-lora-local.yaml
      orch check jobs/gpt2-lora-autodl.yaml --remote
    """
    loaded = load_spec(spec_file)
    hosts = [h if isinstance(h, str) else h.name for h in loaded.spec.hosts]
    resolved = [app.inventory.resolve(ref) for ref in loaded.spec.hosts]
    warnings = laptop_report(loaded)
    check_hosts(loaded, resolved)
    nnodes = 1 if loaded.spec.sweep else loaded.spec.launch.nnodes or len(hosts)  # a sweep: one node per job
    try:
        warnings += hidden.check_warnings(loaded.spec, launchconfig.script(loaded.spec, Path(loaded.workspace_dir)),
                                          nnodes)
    except hidden.Refused as exc:  # a launcher inside the command that cannot be one world
        raise SpecError(f"{loaded.locate(('launch', 'command'))}: {exc}") from None
    for warning in warnings:
        app.say(f"warning: {warning}")
    entry = "built-in trainer" if loaded.spec.train else "command " + " ".join(loaded.spec.launch.command or [])
    notes = launchers.launcher_notes(loaded.spec, launchconfig.counted(loaded.spec, Path(loaded.workspace_dir)),
                                     nnodes)
    click.echo(f"{spec_file}: ok — job {loaded.spec.name!r} on {', '.join(hosts)}: {entry}")
    for note in notes:
        click.echo(textwrap.fill(note, width=78, initial_indent="  ", subsequent_indent="    "))
    if remote:
        preflight_hosts(resolved, app.inventory, Needs.of(loaded.spec, gpudefaults.rows(loaded.spec, Path(loaded.workspace_dir))),
                        lambda host, rows: app.out.print(table(host, rows)))  # exit 4 on a blocker


@click.command("schema")
def schema_cmd() -> None:
    """Print the JSON Schema of job.yaml (for editors: yaml-language-server)."""
    click.echo(json.dumps(JobSpec.model_json_schema(), indent=2))


COMMANDS = [check_cmd, schema_cmd]

"""``orch check`` and ``orch schema``."""

from __future__ import annotations

import json
from pathlib import Path

import click

from orchestrator.cli.app import App, pass_app
from orchestrator.spec import JobSpec, load_spec


@click.command("check")
@click.argument("spec_file", type=click.Path(path_type=Path))
@pass_app
def check_cmd(app: App, spec_file: Path) -> None:
    """Validate a job file; exit 2 with file:line:column and the field when it is invalid.

    \b
    Example:
      orch check jobs/tiny-lora-local.yaml
    """
    loaded = load_spec(spec_file)
    hosts = [h if isinstance(h, str) else h.name for h in loaded.spec.hosts]
    for ref in loaded.spec.hosts:
        app.inventory.resolve(ref)
    entry = "built-in trainer" if loaded.spec.train else "command " + " ".join(loaded.spec.launch.command or [])
    click.echo(f"{spec_file}: ok — job {loaded.spec.name!r} on {', '.join(hosts)}: {entry}")


@click.command("schema")
def schema_cmd() -> None:
    """Print the JSON Schema of job.yaml (for editors: yaml-language-server)."""
    click.echo(json.dumps(JobSpec.model_json_schema(), indent=2))


COMMANDS = [check_cmd, schema_cmd]

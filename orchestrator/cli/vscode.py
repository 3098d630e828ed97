"""``orch ssh-config``, ``orch code`` and ``orch ssh``: the same hosts for VSCode and a shell."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import click

from orchestrator.access.connect import open_transport
from orchestrator.access.power import ready_for_system_ssh
from orchestrator.cli.app import App, pass_app
from orchestrator.errors import UsageError
from orchestrator.helper.remote import Remote
from orchestrator.hosts.inventory import Host
from orchestrator.hosts.sshconfig import alias, inventory_block, own_config, write_user_config
from orchestrator.sync.selection import project_name
from orchestrator.transport.base import never


def _ssh_host(app: App, name: str) -> Host:
    host = app.inventory.get(name)
    if host.kind != "ssh":
        raise UsageError(f"`{name}` is this machine: there is nothing to open over SSH")
    if host.provider is not None:
        return ready_for_system_ssh(app.inventory, host, app.say)
    return host


@click.command("ssh-config")
@click.option("--write", is_flag=True, help="Write the block into ~/.ssh/config (a backup is kept).")
@pass_app
def ssh_config_cmd(app: App, write: bool) -> None:
    """Print (or --write) the `Host orch-<name>` block for every inventory host.

    Only the lines between orch's markers are ever changed; each host gets its own
    known_hosts file holding the key orch pinned.

    \b
    Examples:
      orch ssh-config            # print the block
      orch ssh-config --write    # put it into ~/.ssh/config, then `ssh orch-box` works
    """
    if write:
        write_user_config(app.inventory, app.say)
    else:
        click.echo(inventory_block(app.inventory), nl=False)


def remote_root(app: App, host: Host) -> str:
    """The host's root as an absolute path (asks the host when it starts with ``~``)."""
    if not host.root.startswith("~"):
        return host.root.rstrip("/") or "/"
    with open_transport(host, app.inventory, never) as transport:
        return str(Remote(host, transport).call("hello")["root"]).rstrip("/")


@click.command("code")
@click.argument("host_name", metavar="HOST")
@click.argument("job", required=False)
@click.option("--workspace", "workspace", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Local workspace folder: open its synced copy (<root>/workspace/<project>).")
@pass_app
def code_cmd(app: App, host_name: str, job: str | None, workspace: Path | None) -> None:
    """Open the host's synced workspace (or JOB's code snapshot) in VSCode Remote-SSH.

    Writes the ssh-config block first, then runs `code --remote ssh-remote+orch-HOST PATH`.

    \b
    Examples:
      orch code box --workspace .          # <root>/workspace/<this folder's project>
      orch code box gpt2-lora              # <root>/jobs/<job id>/code, the job's snapshot
      orch code box                        # <root>/workspace
    """
    host = _ssh_host(app, host_name)
    code = shutil.which("code")
    if code is None:
        raise UsageError("the `code` command is not on PATH: in VSCode run "
                         "'Shell Command: Install 'code' command in PATH', and install the Remote-SSH extension")
    if job is not None:
        record = app.registry.get(job)
        if host.name not in record.hosts:
            raise UsageError(f"{record.job_id} ran on {', '.join(record.hosts)}, not on {host.name}")
        path = record.job_dir.rstrip("/") + "/code"
    elif workspace is not None:
        path = f"{remote_root(app, host)}/workspace/{project_name(workspace.resolve())}"
    else:
        path = f"{remote_root(app, host)}/workspace"
    write_user_config(app.inventory, app.say)
    argv = [code, "--remote", f"ssh-remote+{alias(host)}", path]
    app.say(f"opening {path} on {host.name} in VSCode")
    os.execv(code, argv)


@click.command("ssh", context_settings={"ignore_unknown_options": True})
@click.argument("host_name", metavar="HOST")
@click.argument("ssh_args", nargs=-1, type=click.UNPROCESSED)
@pass_app
def ssh_cmd(app: App, host_name: str, ssh_args: tuple[str, ...]) -> None:
    """Open a shell on HOST with the system `ssh` (pinned host key, orch's settings).

    Anything after HOST goes to ssh (a remote command, -L forwards, ...).

    \b
    Examples:
      orch ssh box
      orch ssh box -- nvidia-smi
    """
    host = _ssh_host(app, host_name)
    ssh = shutil.which("ssh")
    if ssh is None:
        raise UsageError("the `ssh` command is not on PATH (install OpenSSH's client)")
    config = own_config(inventory_block(app.inventory), app.inventory.home)
    args = list(ssh_args[1:] if ssh_args[:1] == ("--",) else ssh_args)
    if host.password_env and not host.identity_file:
        app.say(f"{host.name} logs in with a password: it is in ${host.password_env} "
                f"(or turn it into a key: orch hosts add ... --install-key)")
    os.execv(ssh, [ssh, "-F", str(config), alias(host), *args])


COMMANDS = [ssh_config_cmd, code_cmd, ssh_cmd]

"""``orch controller up|status|logs|down``: the managed-jobs controller (docs/managed.md)."""

from __future__ import annotations

import sys
import time

import click

from orchestrator.cli.app import App, pass_app
from orchestrator.controller.client import Controller, choose_host
from orchestrator.termtext import clean


@click.group("controller")
def controller_group() -> None:
    """Run the managed-jobs controller on a host that stays on (docs/managed.md).

    \b
    Examples:
      orch controller up vps          # install orch there, start the controller
      orch controller status
      orch controller logs -f
      orch controller down
    """


def _open(app: App, host: str | None) -> Controller:
    return Controller(app.inventory.get(choose_host(app.inventory.home, host)), app.inventory, app.say)


def _ago(stamp: object) -> str:
    if not isinstance(stamp, (int, float)):
        return "never"
    seconds = max(0, int(time.time() - stamp))
    return f"{seconds} s ago" if seconds < 120 else f"{seconds // 60} min ago"


@controller_group.command("up")
@click.argument("host")
@click.option("--secret", "secrets", multiple=True, metavar="VAR",
              help="Also send this environment variable's value to the controller's memory (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the controller's answer as JSON.")
@pass_app
def up_cmd(app: App, host: str, secrets: tuple[str, ...], as_json: bool) -> None:
    """Install orch on HOST (this laptop's version) and start the controller there; send it
    the secrets it needs (from this laptop's environment, to its memory only).

    Run it again to resend the secrets after the controller restarted (a crash, a reboot)
    or to replace it with this laptop's version.
    """
    with _open(app, host) as ctl:
        reply = ctl.up(secrets)
    if as_json:
        app.json(reply)
        return
    name = ctl.host.name
    how = "started" if reply.get("started") else "already running"
    if reply.get("replaced"):
        how = f"replaced the controller of other code ({reply['replaced']})"
    click.echo(f"controller on {name}: {how}, pid {reply.get('pid')}, orch {reply.get('version')} ({reply.get('code')})")
    cron = str(reply.get("cron"))
    if cron == "installed":
        click.echo(f"{name}: an @reboot line in the crontab starts it again after a reboot")
    elif cron == "absent":
        click.echo(f"{name} has no crontab: the controller does not start again by itself after a reboot; run "
                   f"orch controller up {name} then")
    else:
        click.echo(f"{name}: the crontab line could not be written ({clean(cron)}): after a reboot run "
                   f"orch controller up {name}")
    held = (reply.get("secrets") or {}).get("held") or []
    missing = (reply.get("secrets") or {}).get("missing") or []
    if held:
        click.echo(f"secrets in its memory: {', '.join(held)}")
    if missing:
        click.echo(f"warning: the controller lacks {', '.join(missing)}: set them here and run orch controller up "
                   f"{name} again", err=True)


@controller_group.command("status")
@click.argument("host", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the controller's answer as JSON.")
@pass_app
def status_cmd(app: App, host: str | None, as_json: bool) -> None:
    """Whether the controller runs, its version, the jobs it manages and the last check of each."""
    with _open(app, host) as ctl:
        reply = ctl.status()
    if as_json:
        app.json({"host": ctl.host.name, **reply})
        return
    name = ctl.host.name
    if not reply.get("running"):
        last = reply.get("last") or {}
        since = f" (last pid {last['pid']})" if last.get("pid") else ""
        click.echo(f"controller on {name}: down{since}; orch controller up {name} starts it")
        if reply.get("log"):
            click.echo(clean(str(reply["log"])))
        sys.exit(1)
    click.echo(f"controller on {name}: up, pid {reply.get('pid')}, orch {reply.get('version')} ({reply.get('code')}), "
               f"started {_ago(reply.get('started_at'))}")
    missing = (reply.get("secrets") or {}).get("missing") or []
    if missing:
        click.echo(f"missing secrets: {', '.join(missing)} (it restarted without them: orch controller up {name} "
                   "sends them)")
    jobs = reply.get("jobs") or []
    if not jobs:
        click.echo("no managed jobs")
    for job in jobs:
        click.echo(clean(f"{job.get('job_id')}  {job.get('state')}  on {', '.join(job.get('hosts') or [])}  "
                         f"recovered {job.get('recoveries', 0)}x  checked {_ago(job.get('checked_at'))}"
                         + (f"  {job['note']}" if job.get("note") else "")))


@controller_group.command("logs")
@click.argument("host", required=False)
@click.option("-f", "--follow", is_flag=True, help="Keep printing what it writes until interrupted.")
@click.option("--tail", type=click.IntRange(min=0), default=200, show_default=True, help="Lines of the log to show first.")
@pass_app
def logs_cmd(app: App, host: str | None, follow: bool, tail: int) -> None:
    """Print the controller's log (one timestamped line per check, recovery and event)."""

    def write(data: bytes) -> None:
        app.write(clean(data.decode("utf-8", "replace")))

    with _open(app, host) as ctl:
        ctl.follow_log(follow, tail, write)


@controller_group.command("down")
@click.argument("host", required=False)
@pass_app
def down_cmd(app: App, host: str | None) -> None:
    """Stop the controller and take its @reboot line out of the crontab. Managed jobs go on
    running, unwatched, until it is up again."""
    with _open(app, host) as ctl:
        reply = ctl.down()
    name = ctl.host.name
    if not reply.get("was_running"):
        click.echo(f"controller on {name}: was not running")
    elif reply.get("stopped"):
        click.echo(f"controller on {name}: stopped (pid {reply.get('pid')})")
    else:
        click.echo(f"controller on {name}: asked to stop, still running after 60 s (pid {reply.get('pid')})")
        sys.exit(4)


COMMANDS = [controller_group]

"""``orch queue [HOST]``: each host's GPU queue (remote_payload/gpuqueue/queue.py, docs/queue.md).

What is asked, and how the untrusted reply is checked, is ``jobs/gpuqueue.py``; this module
prints it, text cleaned before it reaches the terminal. Without HOST it asks the hosts of the
registry's unfinished jobs; a host that cannot be asked is named and the others are shown,
then the command exits with that host's error code (3 unreachable, 4 a remote failure).
"""

from __future__ import annotations

import time
from typing import Any

import click

from orchestrator.cli.app import App, pass_app
from orchestrator.display.table import Column, fit, width_for
from orchestrator.errors import OrchError
from orchestrator.jobs import gpuqueue
from orchestrator.termtext import clean

COLUMNS = [Column("#", 2, right=True), Column("JOB", 0, required=True, min_width=8), Column("STATE", 1, required=True),
           Column("GPUS", 3), Column("NEEDS", 4), Column("PRIORITY", 5, right=True), Column("SINCE", 6)]
STALE_S = 30.0  # an inventory older than this is shown with its age


def when(t: float, now: float) -> str:
    """A server time as the laptop's local clock: ``14:03:12``, or ``11-29 14:03`` on another day."""
    fmt = "%H:%M:%S" if time.strftime("%Y%m%d", time.localtime(t)) == time.strftime("%Y%m%d", time.localtime(now)) \
        else "%m-%d %H:%M"
    return time.strftime(fmt, time.localtime(t))


def summary(host: str, reply: dict[str, Any], now: float) -> str:
    """The host's line: its GPUs, how many orch holds, which are busy with other processes."""
    gpus = reply["gpus"]
    if not gpus:
        return f"{host}: no GPU found (nvidia-smi): jobs start at once, nothing waits"
    held = [g for g in gpus if g.get("holder")]
    busy = [str(g["index"]) for g in gpus if g["busy"]]
    free = len(gpus) - len(held) - len(busy)
    line = f"{host}: {len(gpus)} GPU(s), {len(held)} held by orch jobs, {free} free"
    if busy:
        line += f", busy with other processes: GPU {','.join(busy)}"
    seen = reply.get("seen")
    if isinstance(seen, (int, float)) and now - seen > STALE_S:
        line += f" (as seen {int(now - seen)} s ago)"
    return clean(line)


def rows(reply: dict[str, Any], now: float) -> list[list[str]]:
    """One row per job node: running ones first, then the waiting ones in their order."""
    out = []
    for job in reply["jobs"]:
        name = job["job_id"] + (f" (node {job['node_rank']})" if job["node_rank"] else "")
        need = f"{job['need']}" + (f" × {job['memory_gb']:g} GB" if isinstance(job.get("memory_gb"), (int, float)) else "")
        running = job["state"] == "running"
        state = ("unsupervised" if job.get("unsupervised") else "running") if running else "queued"
        since = job.get("granted") if running and isinstance(job.get("granted"), (int, float)) else job["since"]
        out.append([str(job["position"]) if not running and isinstance(job.get("position"), int) else "",
                    clean(name), state, ",".join(map(str, job["gpus"])) or "-",
                    clean(need), str(job["priority"]), when(since, now)])
    return out


@click.command("queue")
@click.argument("host", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON: one object per host.")
@click.option("--wide", is_flag=True, help="Every column, however wide.")
@pass_app
def queue_cmd(app: App, host: str | None, as_json: bool, wide: bool) -> None:
    """Show each host's GPU queue: its GPUs, the running jobs with their GPUs, and the
    waiting ones with their place, priority, what they need and since when.

    Without HOST: the hosts of your unfinished jobs. A job waits (`queued` in orch status)
    while its host's GPUs are taken by other orch jobs or busy with other processes; it
    starts by itself, with the laptop closed. On a Slurm host Slurm is the queue (squeue).

    \b
    Examples:
      orch queue
      orch queue box --json
    """
    names = gpuqueue.hosts_to_ask(app.registry, host)
    if not names:
        click.echo("no unfinished jobs: `orch queue HOST` shows that host's queue")
        return
    hosts = [app.inventory.get(name) for name in names]
    replies = gpuqueue.ask(hosts, app.inventory)
    now, failed = time.time(), [r for r in replies if isinstance(r, OrchError)]
    if as_json:
        app.json([dict(r, host=h.name) for h, r in zip(hosts, replies) if not isinstance(r, OrchError)])
    else:
        width = width_for(wide)
        blocks = []
        for h, reply in zip(hosts, replies):
            if isinstance(reply, OrchError):
                continue
            lines = [summary(h.name, reply, now)]
            if reply["jobs"]:
                lines += ["  " + line for line in fit(COLUMNS, rows(reply, now), None if width is None else width - 2)]
            blocks.append("\n".join(lines))
        if blocks:
            click.echo("\n\n".join(blocks))
    for exc in failed[1:]:
        app.say(f"warning: {str(exc).splitlines()[0]}")
    if failed:
        raise failed[0]


COMMANDS = [queue_cmd]

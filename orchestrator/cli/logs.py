"""``orch logs``."""

from __future__ import annotations

import sys

import click

from orchestrator.cli.app import App, notify_option, pass_app
from orchestrator.jobs import logcache
from orchestrator.jobs.follow import say_end
from orchestrator.state import fences
from orchestrator.termtext import EndLines, same_file


@click.command("logs")
@click.argument("job")
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends (reconnects by itself).")
@notify_option
@click.option("--tail", type=click.IntRange(min=0), default=None, help="Start with the last N lines.")
@click.option("--node", type=click.IntRange(min=0), default=None,
              help="One node's log (0 = the first host); default: every node, lines prefixed [node i].")
@pass_app
def logs_cmd(app: App, job: str, follow: bool, tail: int | None, node: int | None) -> None:
    """Print a job's log; with -f follow it until the job ends.

    \b
    Examples:
      orch logs gpt2-lora-20261129-101500-1a2b -f
      orch logs gpt2-lora --tail 50
    """
    record = app.registry.get(job)
    for fence in fences.pending(app.registry.path, job_ids=[record.job_id]):  # the log is the job's, from where it lives
        app.say(f"warning: {record.job_id} moved to {fence.moved_to}; its attempt on {fence.host} may still run "
                f"(orch stops it at its first contact with {fence.host}); this is the log from {fence.moved_to}")
    kept = logcache.load(record.job_id, record.status()) if node is None and tail is None else None
    if kept is not None:  # an ended job's whole log, kept by an earlier read: no host, no network code loaded
        app.write(kept)
        if follow:
            ends = EndLines()
            ends.feed(kept)
            say_end(record.job_id, record.status(), ends, app.say, same_file(sys.stdout, sys.stderr))
        return
    if follow:
        app.follow(record, node=node, tail=tail)
        return
    from orchestrator.jobs.logs import stream_logs

    stream_logs(record, app.inventory, app.registry, write=app.write, say=app.say, node=node, tail=tail)


COMMANDS = [logs_cmd]

"""``orch logs``."""

from __future__ import annotations

import os
import sys
from contextlib import nullcontext
from typing import IO, Any, Callable

import click

from orchestrator import trace
from orchestrator.cli.app import App, notify_option, pass_app
from orchestrator.jobs import logcache
from orchestrator.state import fences
from orchestrator.state.registry import JobRecord
from orchestrator.termtext import EndLines, final_line, one_line


def same_file(a: IO[str], b: IO[str]) -> bool:
    """True when streams ``a`` and ``b`` write to the same file (one terminal, one pipe:
    ``2>&1``); False when either has no file descriptor."""
    try:
        sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def say_end(app: App, job_id: str, status: dict[str, Any], ends: EndLines, log: IO[str]) -> None:
    """The laptop's last line (``JOB STATE: reason``), unless the log the reader just saw on
    the same output already ended with the supervisor's line saying the same: a failure is
    read once. Written to another file than stderr (``> log.txt``), the log's line is not
    where the reader looks, and the laptop's line is said."""
    if not (ends.said(status) and same_file(log, sys.stderr)):
        app.say(final_line(job_id, status))  # one cleaned line: "JOB failed: rank 0 on node 0: ..."


def follow_to_end(app: App, record: JobRecord, *, as_json: bool = False, node: int | None = None,
                  tail: int | None = None, remotes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Follow until the job is terminal; Ctrl-C stops following and leaves the job running.
    On a terminal, a progress line (step/total, loss, tokens/s) stays under the log. The
    end is said once (``say_end``)."""
    from orchestrator.display.progress import FollowBar
    from orchestrator.jobs.logs import stream_logs

    write = (lambda s: (sys.stderr.write(s), sys.stderr.flush())) if as_json else app.write
    if trace.ON:
        write = first_line_marked(write)
    ends = EndLines()
    try:
        bar = FollowBar(app.err) if FollowBar.enabled(as_json) else None  # plain text when not a terminal
        shown = ends.wrap(bar.wrap(write) if bar else write)
        with bar or nullcontext():
            status = stream_logs(record, app.inventory, app.registry, write=shown, say=app.say, node=node,
                                 follow=True, tail=tail, remotes=remotes)
    except KeyboardInterrupt:
        app.say(f"stopped following; {record.job_id} keeps running (orch logs {record.job_id} -f)")
        raise SystemExit(130) from None
    say_end(app, record.job_id, status, ends, sys.stderr if as_json else sys.stdout)
    app.job_ended(record.job_id, status)
    return status


def first_line_marked(write: Callable[[str], None]) -> Callable[[str], None]:
    """``write`` that marks the trace's ``first line`` phase once, as the log's first text comes."""
    seen = []

    def marked(text: str) -> None:
        if text and not seen:
            seen.append(True)
            trace.mark("first line", f"{len(text)} byte(s) of the log")
        write(text)

    return marked


def report_new_job(app: App, job_id: str, result: dict[str, Any], follow: bool, as_json: bool,
                   remotes: dict[str, Any] | None = None) -> None:
    """The shared end of submit and rerun: follow if asked (on ``remotes``, the command's own
    connections, when given), print JSON or the job id, and exit 1 when a followed job did not
    succeed."""
    if follow:
        status = follow_to_end(app, app.registry.get(job_id), as_json=as_json, remotes=remotes)
        reason = one_line(status["reason"]) if status.get("reason") else status.get("reason")
        result.update(state=status["state"], exit_code=status.get("exit_code"), reason=reason)
    if as_json:
        app.json(result)
    else:
        click.echo(job_id)
    if follow and result["state"] != "succeeded":
        raise SystemExit(1)


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
            say_end(app, record.job_id, record.status(), ends, sys.stdout)
        return
    if follow:
        follow_to_end(app, record, node=node, tail=tail)
        return
    from orchestrator.jobs.logs import stream_logs

    stream_logs(record, app.inventory, app.registry, write=app.write, say=app.say, node=node, tail=tail)


COMMANDS = [logs_cmd]

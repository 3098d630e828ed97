"""The application object handed to every command, and small output helpers.

Everything costly is opened on first use: the rich consoles (``err``, ``out``), the host
inventory (pydantic) and the registry. A command that prints plain text and reads only the
registry — ``orch status`` of finished jobs — loads none of rich, pydantic or paramiko.

The terminal's side of the flows several commands share lives here too, so that no command
module imports another: following a job (``follow``: the progress bar, Ctrl-C, ``--notify``)
over ``jobs/follow.py``, a new job's report (``report_new_job``), and a watch over
``fetch/watch.py`` (``watch``; Ctrl-C's words for a watch: ``stopped_watching``). The flows
themselves are library code; nothing here decides more than what is printed and the exit code.
"""

from __future__ import annotations

import json
import sys
from functools import cached_property
from typing import TYPE_CHECKING, Any, NoReturn

import click

from orchestrator.state.registry import Registry
from orchestrator.termtext import clean

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console

    from orchestrator.helper.remote import Remote
    from orchestrator.hosts.inventory import Inventory
    from orchestrator.state.registry import JobRecord


class App:
    """Lazily opened consoles, inventory and registry; ``say`` writes progress to stderr."""

    notify = False  # --notify / ORCH_NOTIFY: a word on the laptop when a followed or watched job ends

    def job_ended(self, job_id: str, status: dict[str, Any]) -> None:
        """Bell and desktop notification (``orchestrator/display/notify.py``) when asked for."""
        if self.notify:
            from orchestrator.display import notify

            notify.ended(job_id, status)

    @cached_property
    def err(self) -> Console:
        """rich console on stderr (progress lines, bars)."""
        from rich.console import Console

        return Console(stderr=True, highlight=False, soft_wrap=True)

    @cached_property
    def out(self) -> Console:
        """rich console on stdout. Piped output (scripts, grep) gets full rows instead of an
        80-column wrap."""
        from rich.console import Console

        return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 400)

    @cached_property
    def inventory(self) -> Inventory:
        from orchestrator.hosts.inventory import Inventory

        return Inventory()

    @cached_property
    def registry(self) -> Registry:
        return Registry()

    def say(self, message: str) -> None:
        """Progress to stderr. ``message`` may carry server text: control characters are
        dropped and it is never read as markup."""
        message = clean(message)
        if sys.stderr.isatty():
            from rich.markup import escape

            self.err.print(f"[dim]orch:[/dim] {escape(message)}", markup=True, highlight=False)
        else:
            print(f"orch: {message}", file=sys.stderr, flush=True)

    def write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def write_err(self, text: str) -> None:
        """Text as it is (a log) to stderr: ``--json`` keeps stdout for the JSON."""
        sys.stderr.write(text)
        sys.stderr.flush()

    def json(self, value: Any) -> None:
        click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))

    def follow(self, record: JobRecord, *, as_json: bool = False, node: int | None = None,
               tail: int | None = None, remotes: dict[str, Remote] | None = None) -> dict[str, Any]:
        """Follow until the job is terminal (``jobs/follow.py``) and return its status: the log
        on stdout (on stderr with ``as_json``), on a terminal a progress line (step/total,
        loss, tokens/s) under it, the end said once. Ctrl-C stops following and leaves the
        job running (exit 130). An unfinished job with ``launch.ports`` gets the ``orch tunnel``
        command that opens them said first."""
        from orchestrator.display.progress import FollowBar
        from orchestrator.jobs.follow import follow_to_end
        from orchestrator.termtext import same_file
        from remote_payload.contract.protocol import TERMINAL

        log = sys.stderr if as_json else sys.stdout
        write = self.write_err if as_json else self.write
        if record.ports and record.state not in TERMINAL:
            listed = ", ".join(map(str, record.ports))
            self.say(f"{record.job_id} serves port{'s' * (len(record.ports) > 1)} {listed}: "
                     f"orch tunnel {record.job_id}  (in another terminal; prints the local URL)")
        try:
            bar = FollowBar(self.err) if FollowBar.enabled(as_json) else None  # plain text when not a terminal
            status = follow_to_end(record, self.inventory, self.registry, write=write, say=self.say, node=node,
                                   tail=tail, remotes=remotes, bar=bar, log_beside_say=same_file(log, sys.stderr))
        except KeyboardInterrupt:
            self.say(f"stopped following; {record.job_id} keeps running (orch logs {record.job_id} -f)")
            raise SystemExit(130) from None
        self.job_ended(record.job_id, status)
        return status

    def report_new_job(self, job_id: str, result: dict[str, Any], follow: bool, as_json: bool,
                       remotes: dict[str, Remote] | None = None) -> None:
        """The shared end of submit and rerun: follow if asked (on ``remotes``, the command's own
        connections, when given), print ``result`` as JSON (with how a followed job ended) or
        the job id, and exit 1 when a followed job did not succeed."""
        if follow:
            from orchestrator.jobs.follow import ended

            result = ended(result, self.follow(self.registry.get(job_id), as_json=as_json, remotes=remotes))
        if as_json:
            self.json(result)
        else:
            click.echo(job_id)
        if follow and result["state"] != "succeeded":
            raise SystemExit(1)

    def watch(self, record: JobRecord, dest: Path, extra: list[str], everything: bool, interval: float,
              keep_checkpoints: bool) -> dict[str, Any]:
        """``orch fetch --watch`` (``fetch/watch.py``): rounds until the job ends; what moved
        and the job's end said, the summary line on stdout; returns its final status. Ctrl-C
        stops watching (exit 130) and leaves the job running."""
        from orchestrator.fetch.watch import StoppedWatching, watch_to_end

        try:
            return watch_to_end(record, self.inventory, self.registry, dest, say=self.say, echo=click.echo,
                                extra=extra, everything=everything, interval=interval,
                                keep_checkpoints=keep_checkpoints, ended=self.job_ended)
        except StoppedWatching as stopped:
            self.stopped_watching(stopped.job_id)

    def stopped_watching(self, job_id: str) -> NoReturn:
        """Ctrl-C during a watch (``fetch/watch.py``: ``StoppedWatching``): said, exit 130; the
        job keeps running."""
        self.say(f"stopped watching; {job_id} keeps running (orch fetch {job_id} --watch)")
        raise SystemExit(130) from None


pass_app = click.make_pass_decorator(App, ensure=True)


def _set_notify(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    from orchestrator.display import notify

    ctx.ensure_object(App).notify = notify.wanted(value)


notify_option = click.option(
    "--notify", is_flag=True, expose_value=False, callback=_set_notify,
    help="When the job ends: the terminal bell and a desktop notification (ORCH_NOTIFY=1: always).")

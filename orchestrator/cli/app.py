"""The application object handed to every command, and small output helpers.

Everything costly is opened on first use: the rich consoles (``err``, ``out``), the host
inventory (pydantic) and the registry. A command that prints plain text and reads only the
registry — ``orch status`` of finished jobs — loads none of rich, pydantic or paramiko.
"""

from __future__ import annotations

import json
import sys
from functools import cached_property
from typing import TYPE_CHECKING, Any

import click

from orchestrator.state.registry import Registry
from orchestrator.termtext import clean

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.hosts.inventory import Inventory


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

    def json(self, value: Any) -> None:
        click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


pass_app = click.make_pass_decorator(App, ensure=True)


def _set_notify(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    from orchestrator.display import notify

    ctx.ensure_object(App).notify = notify.wanted(value)


notify_option = click.option(
    "--notify", is_flag=True, expose_value=False, callback=_set_notify,
    help="When the job ends: the terminal bell and a desktop notification (ORCH_NOTIFY=1: always).")

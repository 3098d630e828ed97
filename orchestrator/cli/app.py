"""The application object handed to every command, and small output helpers."""

from __future__ import annotations

import json
import sys
from functools import cached_property
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from orchestrator.hosts import Inventory
from orchestrator.registry import Registry
from orchestrator.termtext import clean


class App:
    """Lazily opened inventory and registry; ``say`` writes progress to stderr."""

    def __init__(self) -> None:
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)
        # Piped output (scripts, grep) gets full rows instead of an 80-column wrap.
        self.out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 400)

    @cached_property
    def inventory(self) -> Inventory:
        return Inventory()

    @cached_property
    def registry(self) -> Registry:
        return Registry()

    def say(self, message: str) -> None:
        """Progress to stderr. ``message`` may carry server text: control characters are
        dropped and it is never read as markup."""
        message = clean(message)
        self.err.print(f"[dim]orch:[/dim] {escape(message)}", markup=True, highlight=False) if sys.stderr.isatty() \
            else print(f"orch: {message}", file=sys.stderr, flush=True)

    def write(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def json(self, value: Any) -> None:
        click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


pass_app = click.make_pass_decorator(App, ensure=True)

"""The one verdict type of every check: a ``Row`` (check, value, verdict, note), its three
verdicts, the blockers among rows, and rows as a table for a terminal.

``FAIL`` is a blocker (the job would not run, or would fill the disk); ``WARN`` is worth reading
but stops nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from orchestrator.hosts.inventory import Host

if TYPE_CHECKING:
    from rich.table import Table

OK, WARN, FAIL = "ok", "warn", "FAIL"


@dataclass(frozen=True)
class Row:
    check: str
    value: str
    verdict: str
    note: str = ""


def blockers(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.verdict == FAIL]


def table(host: Host, rows: list[Row]) -> Table:
    """The rows as a table for a terminal (rich is imported here: a submit's checks draw none)."""
    from rich.table import Table
    from rich.text import Text

    out = Table(title=f"{host.name} ({host.target})", title_justify="left", box=None, pad_edge=False)
    for column in ("CHECK", "VALUE", "VERDICT", "NOTE"):
        out.add_column(column)
    style = {OK: "green", WARN: "yellow", FAIL: "bold red"}
    for row in rows:  # Text, not markup: values come from the server
        out.add_row(Text(row.check), Text(row.value), Text(row.verdict, style=style[row.verdict]), Text(row.note))
    return out

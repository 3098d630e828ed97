"""Fit a table of plain-text cells into a terminal width (``width_for`` asks the terminal for
it; the rest is pure: no terminal, no I/O).

``fit`` decides which columns to show and how wide, and returns the table as lines of text:

* columns stay in their display order; which are *kept* is decided by ``Column.priority``
  (lower is more important): columns are taken in that order while they fit, and a column
  whose cells are all empty comes after every column with content, only into space that no
  shortened column could use;
* a ``required`` column is always kept (even when that makes a line overflow a width
  narrower than the required columns' minimums together), and counts at its natural
  width: it is shortened only when the required columns alone do not fit;
* a column with ``min_width`` may be shortened down to it, its cells cut with ``…``; the
  space left after the kept columns' minimums goes to such columns, most important first,
  up to their natural width; a column without ``min_width`` is never shortened;
* a column with ``want_width`` too is taken that wide (at most its natural width) when that
  fits, before less important columns are added: they get only the space left then;
* a ``skippable`` column whose least width does not fit is left out without ending the run:
  the less important columns after it are still taken while they fit (so it never costs
  them their place when it is not shown itself);
* ``width=None`` keeps every column at its natural width.

Every returned line fits in ``width`` terminal cells (wide characters count twice) whenever
the required columns' minimums and the gaps between them do. Cells are single lines: tabs,
carriage returns and newlines become spaces. Callers render the lines as plain text
(never markup) and are responsible for stripping control characters first
(``termtext.clean``).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from dataclasses import dataclass
from typing import Sequence

from rich.cells import cell_len

GAP = "  "
ELLIPSIS = "…"
_BREAKS = re.compile(r"[\t\r\n\x0b\x0c]")


@dataclass(frozen=True)
class Column:
    """One column: its header, how important it is, how it is aligned and whether it may
    be shortened (``min_width`` cells at least, header included, ``…`` marks a cut)."""

    header: str
    priority: int
    right: bool = False
    required: bool = False
    min_width: int | None = None
    want_width: int | None = None
    skippable: bool = False


def one_line(text: str) -> str:
    """``text`` with line breaks and tabs turned into spaces."""
    return _BREAKS.sub(" ", text)


def truncate(text: str, width: int) -> str:
    """``text`` when it fits in ``width`` cells, else its longest head that fits with ``…``
    after it, trailing spaces dropped (at most ``width`` cells in all; empty for ``width`` < 1)."""
    if cell_len(text) <= width:
        return text
    if width < 1:
        return ""
    out, used = [], 0
    for char in text:
        size = cell_len(char)
        if used + size > width - 1:
            break
        out.append(char)
        used += size
    return "".join(out).rstrip() + ELLIPSIS


def _pad(text: str, width: int, right: bool) -> str:
    space = " " * max(width - cell_len(text), 0)
    return space + text if right else text + space


def _least(columns: Sequence[Column], natural: list[int]) -> list[int]:
    """The narrowest each column may be: ``min_width`` (never under its header) or natural."""
    return [natural[i] if c.min_width is None else min(natural[i], max(c.min_width, cell_len(c.header)))
            for i, c in enumerate(columns)]


def _choose(columns: Sequence[Column], natural: list[int], least: list[int], empty: list[bool],
            width: int) -> dict[int, int]:
    """The columns to keep, each with its starting width: required ones whole, the others
    at their least (or their want when that fits) — the longest run by importance that
    fits (no holes filled by lesser columns, so what is shown does not jump about as rows
    change). Empty columns come last and only into the space left once every kept column
    is whole."""
    kept = {i: natural[i] for i, c in enumerate(columns) if c.required}
    gaps = len(GAP) * max(len(kept) - 1, 0)
    used, whole = sum(kept.values()) + gaps, sum(kept.values()) + gaps
    for i in sorted(range(len(columns)), key=lambda i: (empty[i], columns[i].priority, i)):
        if i in kept:
            continue
        gap = len(GAP) if kept else 0
        size = least[i]
        want = columns[i].want_width
        if want is not None and not empty[i] and used + gap + min(natural[i], max(want, size)) <= width:
            size = min(natural[i], max(want, size))
        if (whole if empty[i] else used) + gap + (natural[i] if empty[i] else size) > width:
            if columns[i].skippable and not empty[i]:
                continue
            break
        kept[i] = size
        used, whole = used + gap + size, whole + gap + natural[i]
    return kept


def _widths(columns: Sequence[Column], natural: list[int], least: list[int], kept: dict[int, int],
            width: int) -> dict[int, int]:
    """Final widths: required columns too wide together are cut, least important first, to
    their least; space left over widens shortened columns, most important first."""
    widths = dict(kept)
    left = width - sum(widths.values()) - len(GAP) * max(len(widths) - 1, 0)
    by_priority = sorted((i for i in widths if columns[i].min_width is not None), key=lambda i: (columns[i].priority, i))
    for i in reversed(by_priority):
        cut = max(min(widths[i] - least[i], -left), 0)
        widths[i] -= cut
        left += cut
    for i in by_priority:
        grow = max(min(natural[i] - widths[i], left), 0)
        widths[i] += grow
        left -= grow
    return widths


def fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int | None) -> list[str]:
    """The header line and one line per row (each row has one cell per column), fitted to
    ``width`` cells as the module docstring says; trailing spaces are removed."""
    cells = [[one_line(cell) for cell in row] for row in rows]
    for row in cells:
        if len(row) != len(columns):
            raise ValueError(f"a row has {len(row)} cells for {len(columns)} columns")
    natural = [max([cell_len(c.header)] + [cell_len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    empty = [all(not row[i] for row in cells) for i in range(len(columns))]
    if width is None:
        kept, widths = list(range(len(columns))), dict(enumerate(natural))
    else:
        least = _least(columns, natural)
        widths = _widths(columns, natural, least, _choose(columns, natural, least, empty, width), width)
        kept = sorted(widths)
    lines = []
    for row in [[c.header for c in columns], *cells]:
        parts = [_pad(truncate(row[i], widths[i]), widths[i], columns[i].right) for i in kept]
        lines.append(GAP.join(parts).rstrip())
    return lines


def width_for(wide: bool) -> int | None:
    """The width to fit a table to (``orch status``, ``orch queue``): None (everything) for
    ``--wide`` or when stdout is piped without ``COLUMNS``; on a terminal ``COLUMNS`` or the
    terminal's width, asked each time (``status -w`` follows a resize)."""
    if wide:
        return None
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    columns = os.environ.get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else None

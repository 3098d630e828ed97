"""Checkpoints of an earlier attempt that a fetch brings back beside the newer one, named so
that nobody loads the stale one (``orch fetch``).

Lightning's ``ModelCheckpoint`` never overwrites a ``last.ckpt`` it did not write itself: a
script that started over (no ``ckpt_path``, so no restored callback state) finds the name
taken and saves ``last-v1.ckpt`` beside it, the next such run ``last-v2.ckpt``. In a folder
holding ``last.ckpt`` and ``last-vK.ckpt``, every one but the highest version is therefore an
earlier run's — an earlier attempt's under ``orch resume``. (Other ``-vK`` names are not: one
run versions ``epoch=0.ckpt`` itself when it saves twice an epoch.)

``leftovers`` is pure (names only, as the fetch lists them); ``lines`` words it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

_LAST = re.compile(r"^(?P<folder>(?:.*/)?)last(?:-v(?P<version>\d+))?\.ckpt$")
SHOWN = 5


@dataclass(frozen=True)
class Leftover:
    """``name`` is an earlier run's; ``newer`` the file the latest run wrote beside it."""

    name: str
    newer: str


def leftovers(names: Iterable[str]) -> list[Leftover]:
    """Each ``last.ckpt``/``last-vK.ckpt`` among ``names`` (paths with ``/``) that a higher
    version in the same folder supersedes, by folder then version."""
    series: dict[str, dict[int, str]] = {}
    for name in names:
        m = _LAST.match(name)
        if m:
            series.setdefault(m.group("folder"), {})[int(m.group("version") or 0)] = name
    out = []
    for folder in sorted(series):
        versions = series[folder]
        newest = versions[max(versions)]
        out += [Leftover(versions[v], newest) for v in sorted(versions)[:-1]]
    return out


def lines(items: list[Leftover]) -> list[str]:
    """What ``orch fetch`` says of ``items`` (none when empty): the stale files, each with
    the newer one beside it, the first ``SHOWN``."""
    if not items:
        return []
    out = [f"an earlier attempt's checkpoint{'s' if len(items) > 1 else ''} came back beside the newer one "
           "(Lightning adds -vN when a run that did not resume finds the name taken):"]
    out += [f"  {i.name}  (older than {i.newer})" for i in items[:SHOWN]]
    if len(items) > SHOWN:
        out.append(f"  +{len(items) - SHOWN} more")
    return out

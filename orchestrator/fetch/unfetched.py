"""What the job wrote that no fetch pattern selected, named so that a forgotten ``outputs:``
never loses a result without a word (``orch fetch``, ``orch fetch --watch``).

Promises: ``unfetched`` keeps only what the job wrote — files in its working directory
(``code/...``: the manifest lists there only what the job wrote or changed, never the
synced code) and job-folder files outside orch's own (``contract.jobfolder.ORCH_WRITTEN``,
top-level dot names); it groups them into ``Unfetched`` items (a file alone, or a top
folder with its count), biggest first, each with the ``--include`` pattern that brings it.
``lines`` words the first few for people, within 80 columns but for the command line itself;
``as_json`` is the same as data. Names come from a checked manifest (``safe_entries``): no
control characters; a pattern is escaped for gitignore matching and quoted for the shell.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from orchestrator.fetch.manifest import CODE_PREFIX, Entry
from orchestrator.termtext import size_text
from remote_payload.contract.jobfolder import ORCH_WRITTEN

SHOWN = 5  # items named by ``lines``; the rest are counted
_GLOB = re.compile(r"([*?\[\]])")


@dataclass(frozen=True)
class Unfetched:
    """A file (``name``) or a folder (``name`` ends with ``/``, ``files`` in it) the job wrote
    that was not fetched; ``size`` in bytes; ``pattern`` selects it with ``--include``."""

    name: str
    files: int
    size: int
    pattern: str


def written_by_job(entry: Entry) -> bool:
    """True for a manifest entry the job wrote (not one of orch's records)."""
    if entry.path.startswith(CODE_PREFIX):
        return True
    head = entry.path.split("/", 1)[0]
    return not head.startswith(".") and head not in ORCH_WRITTEN


def pattern_for(name: str) -> str:
    """The gitignore pattern that matches ``name`` (a file, or a folder ending in ``/``)
    literally: glob characters and a leading ``!``/``#`` escaped."""
    escaped = _GLOB.sub(r"\\\1", name)
    return "\\" + escaped if escaped[:1] in ("!", "#") else escaped


def unfetched(entries: list[Entry], here: set[str] | frozenset[str] = frozenset()) -> list[Unfetched]:
    """The job's own files among ``entries`` (the ones no pattern selected) but those named in
    ``here`` (verified on the laptop by an earlier fetch), one item per top-level file and
    per top-level folder (a folder holding one such file is named by that file), biggest
    first, then by name. An entry whose name was seen already (another node's copy) counts
    once."""
    groups: dict[str, dict[str, int]] = {}
    for entry in entries:
        if entry.local in here or not written_by_job(entry):
            continue
        head, sep, _ = entry.local.partition("/")
        groups.setdefault(head + sep, {}).setdefault(entry.local, entry.size)
    items = []
    for top, members in groups.items():
        if len(members) == 1:
            (name, size), = members.items()
            items.append(Unfetched(name, 1, size, pattern_for(name)))
        else:
            items.append(Unfetched(top, len(members), sum(members.values()), pattern_for(top)))
    return sorted(items, key=lambda i: (-i.size, i.name))




def lines(items: list[Unfetched], job_id: str) -> list[str]:
    """The few lines ``orch fetch`` says about ``items`` (none when empty): a header with the
    count and size, the biggest ``SHOWN`` items, how many more, and the command that fetches
    the named ones."""
    if not items:
        return []
    files, size = sum(i.files for i in items), sum(i.size for i in items)
    it = "it" if files == 1 else "them"
    count = "1 file" if files == 1 else f"{files} files"
    out = [f"not fetched: {count} the job wrote, {size_text(size)}; no outputs pattern selects {it}:"]
    shown = items[:SHOWN]
    width = max(len(i.name) for i in shown)
    for item in shown:
        files_in = f" ({item.files} files)" if item.files > 1 else ""
        name = item.name if len(item.name) <= 48 else item.name[:47] + "…"
        out.append(f"  {name:<{min(width, 48)}}  {size_text(item.size)}{files_in}")
    rest = items[SHOWN:]
    if rest:
        out.append(f"  +{len(rest)} more ({size_text(sum(i.size for i in rest))}; orch fetch {job_id} --all "
                   "fetches everything)")
    flags = " ".join(f"--include {shlex.quote(i.pattern)}" for i in shown)
    out.append(f"to fetch {it}: orch fetch {job_id} {flags}")
    out.append(f"  (or add {it} to `outputs:` in the job file)")
    return out


def as_json(items: list[Unfetched]) -> list[dict[str, Any]]:
    """``items`` as data: ``name``, ``files``, ``bytes``, ``include`` (the pattern)."""
    return [{"name": i.name, "files": i.files, "bytes": i.size, "include": i.pattern} for i in items]

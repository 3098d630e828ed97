"""The job folder's symlinks at ``orch fetch``: never followed on the server, each one named.

The server describes every link (``remote_payload/jobdir/manifest.describe_link``: its text,
and whether it resolves — hop by hop, never leaving the folder — to a file or folder inside the
job folder, or points outside, dangles or loops). ``select`` keeps the links the fetch's
patterns select; with ``--follow-links-inside`` a link whose target stays inside becomes a copy
of that target under the link's own name, fetched from the target's listed files (so nothing
is ever read through a link). ``lines`` and ``as_json`` say what became of each one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.fetch.manifest import Entry, Link, copies, inside
from orchestrator.globs.match import Patterns


@dataclass(frozen=True)
class LinkSeen:
    """A selected link and what this fetch made of it: ``files`` of a copy of its target
    (``followed``), or left out."""

    link: Link
    followed: bool = False
    files: int = 0


def select(links: list[Link], entries: list[Entry], spec: Patterns, dest: Path, taken: set[str],
           seen: list[LinkSeen], follow: bool) -> list[Entry]:
    """Add each link ``spec`` selects (once across nodes) to ``seen``; with ``follow``, the
    entries of a copy of each target inside the job folder (names not ``taken`` yet, inside
    ``dest``), which are marked taken and returned for the fetch to request."""
    known = {s.link.local for s in seen}
    out: list[Entry] = []
    for link in links:
        if link.local in known or not (spec.match(link.local) or spec.match(link.local + "/")):
            continue
        known.add(link.local)
        copy = [e for e in copies(link, entries) if e.local not in taken and inside(dest, e.local)] if follow else []
        taken.update(e.local for e in copy)
        out += copy
        seen.append(LinkSeen(link, bool(copy), len(copy)))
    return out


def why(seen: LinkSeen, follow: bool) -> str:
    """What became of a link, in words."""
    link = seen.link
    if seen.followed:
        return f"fetched as a copy of {link.local_to} ({seen.files} file(s))"
    if link.inside:
        what = "the folder" if link.kind == "dir" else "the file"
        if follow:
            return f"not fetched: a link to {what} {link.local_to} inside the job folder, which holds no file orch fetches"
        return f"not fetched: a link to {what} {link.local_to} inside the job folder (--follow-links-inside fetches a copy)"
    return {"outside": "not fetched: it points outside the job folder (never followed)",
            "dangling": "not fetched: a dangling link (its target does not exist)",
            "loop": "not fetched: a link to a folder that holds it, or a loop of links",
            "other": "not fetched: a link to something that is neither a file nor a folder"}[link.kind]


def lines(seen: list[LinkSeen], follow: bool) -> list[str]:
    """One line per link: ``outputs/latest -> step-2: not fetched: ...`` (names as ``ascii()``
    writes them past the first and last quote: server text never reaches a terminal raw)."""
    return [f"{ascii(s.link.local)[1:-1]} -> {ascii(s.link.target)[1:-1]}: {why(s, follow)}" for s in seen]


def as_json(seen: list[LinkSeen], follow: bool) -> list[dict[str, Any]]:
    """``orch fetch --json``'s ``links``."""
    return [{"path": s.link.local, "target": s.link.target, "kind": s.link.kind, "inside": s.link.inside,
             "to": s.link.local_to or None, "followed": s.followed, "files": s.files, "why": why(s, follow)}
            for s in seen]

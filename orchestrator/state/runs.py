"""Folders orch itself writes on the laptop (``orch fetch``, ``orch plot``), and how sync
knows them.

Each such folder holds a marker file, ``.orch-run``. ``sync.select_files`` never descends
into a folder that holds one, wherever it lies in a workspace — so ``runs/`` (the default
fetch destination, which usually sits inside the project) never goes back up to a server,
and a user's own folder that happens to be called ``runs/`` (TensorBoard's default) still
syncs.
"""

from __future__ import annotations

import os
from pathlib import Path

MARKER = ".orch-run"
MARKER_TEXT = ("This folder was written by orch (fetch or plot). `orch submit` never syncs a\n"
               "folder holding this file. Delete the file to sync the folder again.\n")


def run_dir(parent: Path, job_id: str) -> Path:
    """``parent/<job_id>/``, created with its marker (the marker first, so a fetch cut off
    half-way still leaves a folder that sync skips)."""
    folder = parent / job_id
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / MARKER
    if not marker.is_file():
        marker.write_text(MARKER_TEXT, encoding="utf-8")
    return folder


def is_run_dir(folder: Path) -> bool:
    """True when ``folder`` holds the marker; False for a folder that cannot be read."""
    return os.path.isfile(folder / MARKER)


def describe(folders: list[str]) -> str:
    """``["runs/a/", "runs/b/", "x/c/"]`` -> ``"runs/ (2 folders), x/c/"``: compact for one line."""
    by_parent: dict[str, list[str]] = {}
    for folder in folders:
        parent = folder.rstrip("/").rpartition("/")[0]
        by_parent.setdefault(parent + "/" if parent else "", []).append(folder)
    parts = []
    for parent, members in by_parent.items():
        if parent and len(members) > 1:
            parts.append(f"{parent} ({len(members)} folders)")
        else:
            parts.extend(members)
    return ", ".join(parts)

"""A bounded breadth-first look through a job folder (standard library only): where a job's
own script left its files (checkpoints: ``supervisor/lastcheckpoint.py``).

Contract: ``folders`` lists at most ``SCAN_DIRS`` folders and ``SCAN_ENTRIES`` entries in all,
``depth`` levels of folders (the root is the first); a hidden name or one of ``SKIP`` is never
yielded or entered, nor is a link to a folder; an unreadable folder is passed over. It never
raises for what it finds.
"""

from __future__ import annotations

import os
from typing import Callable, Iterator, List, Tuple

SCAN_DIRS, SCAN_ENTRIES = 2000, 50000
SKIP = ("logs", "repro", "__pycache__", "node_modules")


def folders(root: str, depth: int, enter: Callable[["os.DirEntry[str]"], bool] = lambda e: True
            ) -> Iterator[Tuple[str, List["os.DirEntry[str]"]]]:
    """(folder, its entries but hidden and ``SKIP`` names) breadth-first from ``root``; a
    sub-folder is listed in its turn when ``enter(entry)`` says so."""
    level, visited, seen = [root], 0, 0
    for _ in range(depth):
        nxt: List[str] = []
        for folder in level:
            visited += 1
            if visited > SCAN_DIRS or seen > SCAN_ENTRIES:
                return
            try:
                with os.scandir(folder) as it:
                    entries = [e for _, e in zip(range(SCAN_ENTRIES - seen + 1), it)]
            except OSError:
                continue
            seen += len(entries)
            entries = [e for e in entries if not e.name.startswith(".") and e.name not in SKIP]
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False) and enter(entry):
                        nxt.append(entry.path)
                except OSError:
                    continue
            yield folder, entries
        level = nxt

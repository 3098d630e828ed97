"""Text from a server is untrusted: strip what could drive the user's terminal; the end of a
followed log (``final_line``, ``EndLines``) and whether two streams reach one file (``same_file``);
a byte count for people (``size_text``)."""

from __future__ import annotations

import codecs
import os
import re
from typing import IO, Any, Callable

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
MAX_REASON = 500  # characters of a server's reason printed at the end of a followed log


def clean(text: str) -> str:
    """Drop escape sequences' introducers and other control characters; keep \\n, \\t, \\r."""
    return _CONTROL.sub("", text)


def same_file(a: IO[str], b: IO[str]) -> bool:
    """True when streams ``a`` and ``b`` write to the same file (one terminal, one pipe:
    ``2>&1``); False when either has no file descriptor."""
    try:
        sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


class CleanDecoder:
    """Incremental UTF-8 decode + ``clean``: chunk boundaries may split characters."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, chunk: bytes, final: bool = False) -> str:
        return clean(self._decoder.decode(chunk, final))


def one_line(text: Any, limit: int = MAX_REASON) -> str:
    """Server text as one line of printable text: control characters dropped (``clean``),
    newlines, tabs and runs of spaces collapsed to one space, at most ``limit`` characters."""
    line = " ".join(clean(str(text)).split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def final_line(job_id: str, status: dict[str, Any]) -> str:
    """``JOB STATE[: reason]`` — what ``orch logs -f`` / ``submit --follow`` print last."""
    reason = one_line(status.get("reason") or "")
    return f"{job_id} {one_line(status.get('state'), 40)}" + (f": {reason}" if reason else "")


# The supervisor's last word in a node log (remote_payload/supervisor/supervisor.py, ``finish``):
# "[orch] job STATE" or "[orch] job STATE: REASON", after "[node i] " in a merged log.
_END_LINE = re.compile(r"^(?:\[node \d+\] )?\[orch\] job ([a-z_]+)(?:: (.*))?$")
_NODE_HEAD = re.compile(r"^node \d+: ")  # how ``aggregate`` names the node in a multi-node job's reason


class EndLines:
    """Watches log text for the supervisor's end lines, so the one who follows a log can tell
    whether the log itself already said how the job ended (``said``). Text arrives in chunks
    of any size; only whole lines count."""

    def __init__(self) -> None:
        self.rest = ""
        self.seen: set[tuple[str, str]] = set()  # (state, reason as one line)

    def feed(self, text: str) -> None:
        lines = (self.rest + text).split("\n")
        self.rest = lines.pop()[-4096:]
        for line in lines:
            match = _END_LINE.match(line.rstrip("\r"))
            if match:
                self.seen.add((match.group(1), one_line(match.group(2) or "")))

    def wrap(self, write: Callable[[str], None]) -> Callable[[str], None]:
        def both(text: str) -> None:
            write(text)
            self.feed(text)
        return both

    def said(self, status: dict[str, Any]) -> bool:
        """True when the log held an end line with ``status``' state and reason (a multi-node
        job's reason also without its ``node N:`` head)."""
        state, reason = status.get("state"), one_line(status.get("reason") or "")
        return (state, reason) in self.seen or (state, _NODE_HEAD.sub("", reason)) in self.seen


def size_text(size: int) -> str:
    """``812 B``, ``4.0 KB``, ``2.9 MB``, ``1.25 GB`` (binary units)."""
    if size < 1024:
        return f"{size} B"
    if size < 1 << 20:
        return f"{size / 1024:.1f} KB"
    if size < 1 << 30:
        return f"{size / 2**20:.1f} MB"
    return f"{size / 2**30:.2f} GB"

"""Text from a server is untrusted: strip what could drive the user's terminal."""

from __future__ import annotations

import codecs
import re
from typing import Any

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
MAX_REASON = 500  # characters of a server's reason printed at the end of a followed log


def clean(text: str) -> str:
    """Drop escape sequences' introducers and other control characters; keep \\n, \\t, \\r."""
    return _CONTROL.sub("", text)


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

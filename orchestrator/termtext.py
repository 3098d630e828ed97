"""Text from a server is untrusted: strip what could drive the user's terminal."""

from __future__ import annotations

import codecs
import re

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def clean(text: str) -> str:
    """Drop escape sequences' introducers and other control characters; keep \\n, \\t, \\r."""
    return _CONTROL.sub("", text)


class CleanDecoder:
    """Incremental UTF-8 decode + ``clean``: chunk boundaries may split characters."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, chunk: bytes, final: bool = False) -> str:
        return clean(self._decoder.decode(chunk, final))

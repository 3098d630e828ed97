"""``ByteQueue``: bytes that arrive in chunks at the back and are taken from the front.

Every reader of a stream on both sides (a helper's frames, a fetched file's stream, the
connection holder's frames, a sync's input on the server) keeps what it read but has not
used yet. Kept as one ``bytes`` that is sliced from the front (``buf = buf[n:]``) or grown
(``buf += chunk``), each small read copies everything behind it: reading a 1 MiB frame in
tarfile's 10 KiB records copies ~50 MiB. Here a chunk is kept as it came and copied once at
most, when a take ends inside it or spans several; a take of exactly what is at the front
returns the chunk itself.

Standard library only and Python >= 3.8 (both sides import it).
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Optional


class ByteQueue:
    """A FIFO of bytes; ``len()`` is what it holds."""

    def __init__(self, data: bytes = b"") -> None:
        self._chunks = deque()  # type: Deque[bytes]
        self._start = 0  # bytes of the first chunk already taken
        self._len = 0
        self.put(data)

    def __len__(self) -> int:
        return self._len

    def put(self, data: bytes) -> None:
        """Append ``data`` (kept as it is; a ``bytearray`` or view is copied once)."""
        if data:
            self._chunks.append(data if type(data) is bytes else bytes(data))
            self._len += len(data)

    def take(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes from the front (everything when ``n`` < 0)."""
        n = self._len if n < 0 else min(n, self._len)
        if n <= 0:
            return b""
        self._len -= n
        first = self._chunks[0]
        end = self._start + n
        if end <= len(first):  # within the first chunk (all of it: the chunk itself, uncopied)
            out = first[self._start:end]
            if end == len(first):
                self._chunks.popleft()
                end = 0
            self._start = end
            return out
        parts = []
        need = n
        while need:
            first = self._chunks[0]
            left = len(first) - self._start
            if left <= need:
                parts.append(memoryview(first)[self._start:] if self._start else first)
                self._chunks.popleft()
                self._start = 0
                need -= left
            else:
                parts.append(memoryview(first)[self._start:self._start + need])
                self._start += need
                need = 0
        return b"".join(parts)

    def take_some(self, n: int) -> bytes:
        """Up to ``n`` (> 0) bytes from the front, never more than the first chunk holds: never
        a join (a reader that accepts short reads copies nothing it need not)."""
        if not self._len:
            return b""
        return self.take(min(n, len(self._chunks[0]) - self._start))

    def find(self, byte: bytes, limit: int) -> int:
        """The offset of the first ``byte`` (one byte) within the first ``limit`` bytes held,
        or -1."""
        seen = 0
        start = self._start
        for chunk in self._chunks:
            if seen >= limit:
                break
            stop = min(len(chunk), start + limit - seen)
            at = chunk.find(byte, start, stop)
            if at >= 0:
                return seen + at - start
            seen += stop - start
            start = 0
        return -1

    def line(self, limit: int) -> Optional[bytes]:
        """The first whole line without its newline (taken, with the newline), when one ends
        within the first ``limit`` + 1 bytes; else ``None`` (nothing taken)."""
        at = self.find(b"\n", limit + 1)
        if at < 0:
            return None
        out = self.take(at + 1)
        return out[:-1]

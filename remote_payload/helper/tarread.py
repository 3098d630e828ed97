"""A sync's tar stream read on the server without ``tarfile.TarFile``: one member's header at a
time, its data read straight from the stream.

The laptop writes the stream (``orchestrator/sync/tarstream.py``): a POSIX ustar header per
member, a pax extended header (``x``) before a member that needs one (a long or non-ASCII name,
a file of 8 GiB or more, a resumed file's ``orch.*`` records). ``tarfile``'s reader spends ~80 µs
per member (a ``TarInfo`` built field by field, its pax and GNU checks, a file object per
member): most of a first sync's server time for thousands of small files. ``Reader`` parses
the same headers in a few µs, and reads what ``tarfile`` reads from orch's streams: ustar and
old-GNU headers (octal or base-256 numbers), pax ``x`` and ``g`` records (``path``,
``linkpath``, ``size``, any other key kept in ``pax_headers``), GNU long names (``L``, ``K``).

Contract: a header whose checksum is wrong, or a stream that ends inside a header or a member's
data, raises ``tarfile.ReadError`` (the stream broke off: ``workspace.receive`` keeps what
arrived) — where ``tarfile`` would end the archive quietly at a garbled header after the
first. The archive ends at its first zero block. Names are decoded as UTF-8 with
``surrogateescape``, as ``tarfile`` does on Linux. Standard library only, Python >= 3.8.
"""

from __future__ import annotations

import tarfile
from typing import IO, Dict, Iterator, Optional

BLOCK = 512
_ZERO = bytes(BLOCK)
_PAX, _GLOBAL, _LONGNAME, _LONGLINK = b"x", b"g", b"L", b"K"
_FILE_TYPES = (b"0", b"\0", b"7")  # regular file (b"7": contiguous, read as one)
_MAX_META = 1 << 20  # a pax or long-name member's data, at most


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _field(raw: bytes) -> str:
    """A NUL-terminated string field."""
    end = raw.find(b"\0")
    return _text(raw if end < 0 else raw[:end])


def _number(raw: bytes) -> int:
    """An octal field (NUL- or space-padded), or GNU's base-256 (first byte 0x80 or 0xff)."""
    if raw[0] in (0x80, 0xFF):
        value = int.from_bytes(raw[1:], "big")
        return value - (256 ** (len(raw) - 1)) if raw[0] == 0xFF else value
    digits = raw.split(b"\0", 1)[0].strip()
    try:
        return int(digits or b"0", 8)
    except ValueError:
        raise tarfile.ReadError("a garbled number field %r in the sync stream" % raw) from None


class Member:
    """One member: ``name``, ``type`` (the typeflag byte), ``size`` (of its data in the
    stream), ``mode``, ``linkname``, ``pax_headers`` (its pax records, the global ones too)."""

    __slots__ = ("name", "type", "size", "mode", "linkname", "pax_headers")

    def __init__(self, name: str, kind: bytes, size: int, mode: int, linkname: str, pax: Dict[str, str]) -> None:
        self.name, self.type, self.size, self.mode, self.linkname, self.pax_headers = name, kind, size, mode, linkname, pax

    def isfile(self) -> bool:
        return self.type in _FILE_TYPES

    def issym(self) -> bool:
        return self.type == b"2"


class Reader:
    """Members of the tar stream ``stream`` (``read(n)`` gives ``n`` bytes unless it ended;
    ``read1(n)``, when it has one, 1 to ``n`` bytes), in order: iterate, and read each member's
    data with ``read`` before asking for the next (what is left unread of it is skipped)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self._some = getattr(stream, "read1", None)
        self._left = 0  # data of the current member not read yet
        self._pad = 0  # zeros after it, up to its last block
        self._global: Dict[str, str] = {}

    def _exactly(self, n: int) -> bytes:
        data = self.stream.read(n)
        if len(data) != n:
            raise tarfile.ReadError("unexpected end of data")
        return data

    def read(self, n: int = -1) -> bytes:
        """The current member's data: all the rest when ``n`` < 0; else 1 to ``n`` bytes (as
        they came when the stream reads short, else ``n``) and ``b""`` at its end."""
        if n < 0 or self._some is None:
            n = self._left if n < 0 else min(n, self._left)
            data = self._exactly(n) if n > 0 else b""
        else:
            data = self._some(min(n, self._left)) if self._left else b""
            if self._left and not data:
                raise tarfile.ReadError("unexpected end of data")
        self._left -= len(data)
        return data

    def _skip_rest(self) -> None:
        while self._left:
            self.read(1 << 20)
        if self._pad:
            self._exactly(self._pad)
            self._pad = 0

    def __iter__(self) -> Iterator[Member]:
        while True:
            member = self.next()
            if member is None:
                return
            yield member

    def next(self) -> Optional[Member]:
        """The next member (its data not read yet), or None at the archive's end."""
        self._skip_rest()
        pax: Dict[str, str] = {}
        long_name = long_link = None
        while True:
            block = self._exactly(BLOCK)
            if block == _ZERO:
                return None
            if not _checksum_ok(block):
                raise tarfile.ReadError("a sync stream header with a bad checksum")
            kind, size = block[156:157], _number(block[124:136])
            if kind in (_PAX, _GLOBAL, _LONGNAME, _LONGLINK):
                if not 0 <= size <= _MAX_META:
                    raise tarfile.ReadError("a sync stream's %r header of %d bytes" % (kind, size))
                data = self._exactly(size + (-size % BLOCK))[:size]
                if kind == _LONGNAME:
                    long_name = _field(data)
                elif kind == _LONGLINK:
                    long_link = _field(data)
                else:
                    records = _pax_records(data)
                    (self._global if kind == _GLOBAL else pax).update(records)
                continue
            break
        every = dict(self._global, **pax) if self._global else pax
        name = _field(block[0:100])
        if block[257:263] == b"ustar\0" and block[345]:  # POSIX ustar: a long name split as prefix/name
            name = _field(block[345:500]) + "/" + name
        name = every.get("path", long_name if long_name is not None else name)
        link = every.get("linkpath", long_link if long_link is not None else _field(block[157:257]))
        if "size" in every:
            try:
                size = int(every["size"])
            except ValueError:
                raise tarfile.ReadError("a garbled pax size %r" % every["size"]) from None
        if size < 0:
            raise tarfile.ReadError("a negative member size in the sync stream")
        if kind in (b"1", b"2", b"3", b"4", b"5", b"6"):  # links, devices, folders, fifos: no data
            size = 0
        if kind == b"\0" and name.endswith("/"):  # old tars' folder: a file named with a slash
            kind = b"5"
        if kind == b"5":
            name = name.rstrip("/")
        self._left, self._pad = size, -size % BLOCK
        return Member(name, kind, size, _number(block[100:108]), link, every)


def _checksum_ok(block: bytes) -> bool:
    """The header's checksum field against its bytes summed with that field as spaces,
    unsigned (POSIX) or signed (some old tars), as ``tarfile`` accepts either."""
    want = _number(block[148:156])
    if want == sum(block[:148]) + 256 + sum(block[156:]):
        return True
    return want == sum(memoryview(block[:148]).cast("b")) + 256 + sum(memoryview(block[156:]).cast("b"))


def _pax_records(data: bytes) -> Dict[str, str]:
    """``"%d %s=%s\\n"`` records: length (of the whole record, in decimal), key, value."""
    out: Dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError:
            raise tarfile.ReadError("a garbled pax record in the sync stream") from None
        record = data[space + 1:pos + length]
        if length <= 0 or space < 0 or pos + length > len(data) or not record.endswith(b"\n") or b"=" not in record:
            raise tarfile.ReadError("a garbled pax record in the sync stream")
        key, value = record[:-1].split(b"=", 1)
        out[_text(key)] = _text(value)
        pos += length
    return out

"""A tar stream's bytes, written without ``tarfile.TarFile``: the header of each member and the
stream's end. The server reads it with its own reader (``remote_payload/helper/tarread.py``),
which reads whatever ``tarfile`` writes too.

A sync sends thousands of small files; ``tarfile``'s ``addfile`` spends ~20 µs per member on
its header alone (a copy of the member, a pax check of every field) and copies each file
through another buffer. ``header`` builds the common member's POSIX ustar block directly
(~6 µs): a regular file or symlink whose name and link target are ASCII and fit their fields,
with no pax records, size and mode in range. Any other member (a long or non-ASCII name, a file
of 8 GiB or more, a member with ``pax_headers`` such as a resumed file's ``orch.*`` records)
gets ``tarfile``'s own pax header, byte for byte what ``TarFile.addfile`` would write.
"""

from __future__ import annotations

import tarfile

BLOCK = tarfile.BLOCKSIZE  # 512: headers and data are padded to it
RECORD = tarfile.RECORDSIZE  # a stream ends padded to it, as tar -b20 and tarfile do
ENCODING = "utf-8"

_NAME = 100  # ustar's name and linkname fields, in bytes
_MAX_SIZE = 8 ** 11  # 11 octal digits
_MAGIC = tarfile.POSIX_MAGIC  # b"ustar\x0000"
_SIMPLE = (tarfile.REGTYPE, tarfile.SYMTYPE)


def header(info: tarfile.TarInfo) -> bytes:
    """The header block(s) of ``info`` (its data, padded to ``BLOCK``, follows)."""
    name, link = info.name, info.linkname
    if (info.type in _SIMPLE and not info.pax_headers and len(name) <= _NAME and len(link) <= _NAME
            and name.isascii() and link.isascii() and 0 <= info.size < _MAX_SIZE
            and type(info.mtime) is int and 0 <= info.mtime < _MAX_SIZE
            and not (info.uid or info.gid or info.uname or info.gname)):
        return _ustar(name.encode("ascii"), info.mode & 0o7777, info.size, info.mtime, info.type, link.encode("ascii"))
    return info.tobuf(tarfile.PAX_FORMAT, ENCODING, "surrogateescape")


def _ustar(name: bytes, mode: int, size: int, mtime: int, kind: bytes, link: bytes) -> bytes:
    block = bytearray(BLOCK)
    block[0:len(name)] = name
    block[100:108] = b"%07o\0" % mode
    block[108:124] = b"0000000\x000000000\0"  # uid, gid
    block[124:136] = b"%011o\0" % size
    block[136:148] = b"%011o\0" % mtime
    block[148:156] = b"        "  # the checksum counts its own field as spaces
    block[156:157] = kind
    block[157:157 + len(link)] = link
    block[257:265] = _MAGIC
    block[148:155] = b"%06o\0" % sum(block)
    return bytes(block)


def padding(size: int) -> bytes:
    """The zeros that follow ``size`` bytes of data up to the next block."""
    return bytes(-size % BLOCK)


def end(written: int) -> bytes:
    """The end of a stream of ``written`` bytes so far: two zero blocks, then zeros up to a
    whole record."""
    return bytes(2 * BLOCK + (-(written + 2 * BLOCK) % RECORD))

"""helper/tarread.py: the server's own tar reader. Every member a sync sends (the laptop's
``tarstream`` stream) and every header format tarfile and GNU tar write read back as tarfile
reads them, data included, also from a stream that hands out its bytes a few at a time; a
stream cut anywhere or a garbled header raises ``tarfile.ReadError`` (tarfile would end the
archive quietly at a garbled header after the first)."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from remote_payload.contract.bytequeue import ByteQueue
from remote_payload.helper import tarread
from tests.orchestrator.sync.test_tarstream import ours


def _members(formats: int) -> bytes:
    """An archive tarfile writes in ``formats`` with long, split, non-ASCII and non-UTF-8 names,
    links, folders, empty and block-sized files and extra pax records."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=formats, encoding="utf-8", errors="surrogateescape") as tar:
        def add(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE, link: str = "", mode: int = 0o640,
                pax: dict[str, str] | None = None) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode, info.size = kind, link, mode, len(data)
            if pax and formats == tarfile.PAX_FORMAT:
                info.pax_headers = pax
            tar.addfile(info, io.BytesIO(data))

        add("plain.txt", b"hello\n")
        add("empty")
        add("one/block.bin", bytes(range(256)) * 2, mode=0o755)
        add("a" * 99 + "/" + "b" * 90, b"split into prefix and name")  # ustar's prefix field
        if formats != tarfile.USTAR_FORMAT:  # ustar has no room for these
            add("deep/" + "long" * 70, b"longer than any ustar field")  # pax path or GNU L
            add("far-link", kind=tarfile.SYMTYPE, link="t" * 150, mode=0o777)  # pax linkpath or GNU K
        add("données/模型.py", "ünïcode".encode())
        add("bad-\udcff-name", b"\xff")
        add("dir", kind=tarfile.DIRTYPE, mode=0o755)
        add("link", kind=tarfile.SYMTYPE, link="../data/x", mode=0o777)
        add("resumed.bin", b"x" * 1000, pax={"orch.offset": "1048576", "orch.sha256": "cd" * 32})
    return out.getvalue()


def _by_tarfile(stream: bytes) -> list[tuple]:
    with tarfile.open(fileobj=io.BytesIO(stream), mode="r:", encoding="utf-8", errors="surrogateescape") as tar:
        return [(m.name, m.type, m.linkname, m.mode, m.size if m.isfile() else 0,
                 tar.extractfile(m).read() if m.isfile() else b"", _ours(m.pax_headers)) for m in tar]


def _by_reader(stream: object, piece: int = 1 << 20) -> list[tuple]:
    reader, out = tarread.Reader(stream), []  # type: ignore[arg-type]
    for m in reader:
        data = b""
        while m.isfile() and (got := reader.read(piece)):
            assert len(got) <= piece
            data += got
        out.append((m.name, m.type, m.linkname, m.mode, m.size, data, _ours(m.pax_headers)))
    return out


def _ours(pax: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in pax.items() if k.startswith("orch.")}


class Trickle:
    """A stream with ``read1`` (as the helper's ``Input``) that hands out at most 7 bytes."""

    def __init__(self, data: bytes) -> None:
        self.q = ByteQueue(data)

    def read(self, n: int = -1) -> bytes:
        return self.q.take(n)

    def read1(self, n: int) -> bytes:
        return self.q.take_some(min(n, 7))


STREAMS = {
    "laptop's tarstream": ours,
    "tarfile pax": lambda: _members(tarfile.PAX_FORMAT),
    "tarfile gnu": lambda: _members(tarfile.GNU_FORMAT),
    "tarfile ustar": lambda: _members(tarfile.USTAR_FORMAT),
}


@pytest.mark.parametrize("which", STREAMS)
def test_every_member_reads_as_tarfile_reads_it(which: str) -> None:
    stream = STREAMS[which]()
    want = _by_tarfile(stream)
    assert len(want) >= 9
    assert _by_reader(io.BufferedReader(io.BytesIO(stream))) == want
    assert _by_reader(Trickle(stream), piece=100) == want  # short reads: the data the same


def test_members_left_unread_are_skipped_and_the_archive_ends_at_its_zero_block() -> None:
    stream = ours() + b"whatever follows the end"
    reader = tarread.Reader(io.BytesIO(stream))
    names = [m.name for m in reader]  # no data read at all
    assert names == [n for n, *_ in _by_tarfile(ours())]
    assert reader.read(10) == b""  # no member: no data


@pytest.mark.parametrize("fmt", ["gnu", "posix", "ustar"])
def test_gnu_tars_own_archive_reads_as_tarfile_reads_it(tmp_path: Path, fmt: str) -> None:
    src = tmp_path / "src"
    deep = src / ("x" * 70) / ("w" * 70)
    deep.mkdir(parents=True)
    (deep / ("z" * 90)).write_bytes(b"a ustar prefix and name")
    if fmt != "ustar":  # a file name over ustar's 100 bytes: a GNU L header or a pax path
        (deep / ("y" * 130)).write_bytes(b"long path")
    (src / "small").write_bytes(b"s" * 700)
    (src / "to-small").symlink_to("small")
    made = subprocess.run(["tar", f"--format={fmt}", "-cf", "-", "-C", str(src), "."], capture_output=True, check=True)
    want = _by_tarfile(made.stdout)
    assert any(len(name) > 200 for name, *_ in want)
    assert _by_reader(io.BytesIO(made.stdout)) == want


def test_numbers_in_octal_and_base_256() -> None:
    assert tarread._number(b"0000644\0") == 0o644
    assert tarread._number(b"   755 \0") == 0o755
    assert tarread._number(b"\0" * 8) == 0
    assert tarread._number(b"\x80" + (10 << 30).to_bytes(11, "big")) == 10 << 30  # a 10 GiB file, GNU style
    assert tarread._number(b"\xff" * 12) == -1
    with pytest.raises(tarfile.ReadError):
        tarread._number(b"12a4\0\0\0\0")


@pytest.mark.parametrize("cut", [0, 100, 511, 512, 700, 1023, 1536])
def test_a_stream_cut_anywhere_raises_read_error(cut: int) -> None:
    stream = ours()[:cut]
    with pytest.raises(tarfile.ReadError):
        _by_reader(io.BytesIO(stream))
    with pytest.raises(tarfile.ReadError):
        _by_reader(Trickle(stream))


def test_a_garbled_header_after_the_first_raises_where_tarfile_ends_quietly() -> None:
    stream = bytearray(ours())
    second = 1024  # the first member (37 bytes) takes a header and one data block
    assert stream[second:second + 5] == b"train"
    stream[second + 1] ^= 0x01
    garbled = bytes(stream)
    assert len(_by_tarfile(garbled)) == 1  # tarfile: an archive of one member, no error
    with pytest.raises(tarfile.ReadError, match="checksum"):
        _by_reader(io.BytesIO(garbled))


def test_garbled_pax_records_raise_read_error() -> None:
    for records in (b"12 path=ab\n", b"x path=abc\n", b"9 pathabc\n", b"100 path=a\n"):
        info = tarfile.TarInfo("././@PaxHeader")
        info.type, info.size = tarfile.XHDTYPE, len(records)
        stream = info.tobuf(tarfile.USTAR_FORMAT) + records + bytes(-len(records) % 512)
        stream += tarfile.TarInfo("f").tobuf(tarfile.USTAR_FORMAT) + bytes(1024)
        with pytest.raises(tarfile.ReadError, match="pax"):
            _by_reader(io.BytesIO(stream))


def test_take_some_never_joins_chunks() -> None:
    q = ByteQueue(b"abc")
    q.put(b"defgh")
    assert q.take_some(10) == b"abc"
    assert q.take_some(2) == b"de" and q.take_some(10) == b"fgh"
    assert q.take_some(5) == b"" and len(q) == 0

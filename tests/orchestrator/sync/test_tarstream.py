"""sync/tarstream.py: the laptop's own tar headers. A stream of every kind of member a sync
sends reads back through tarfile and GNU tar member for member (the server's own reader:
tests/remote_payload/helper/test_tarread.py), and the common member's header is the very block
tarfile writes."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from orchestrator.sync import tarstream

MEMBERS = [  # (name, size or a symlink's target, mode, pax records)
    (".orch-sync.json", 37, 0o644, {}),
    ("train.py", 1000, 0o755, {}),
    ("empty", 0, 0o600, {}),
    ("exactly/one/block.bin", 512, 0o644, {}),
    ("n" * 100, 3, 0o644, {}),  # fills ustar's name field
    ("d/" + "long" * 40, 5, 0o644, {}),  # longer than the field: a pax path
    ("données/模型.py", 7, 0o644, {}),  # not ASCII: a pax path
    ("bad-\udcff-name", 2, 0o644, {}),  # a name that is not UTF-8 on disk (surrogateescape)
    ("link", "../data/x", 0o777, {}),
    ("far-link", "t" * 150, 0o777, {}),  # a long target: a pax linkpath
    ("resumed.bin", 9, 0o644, {"orch.offset": "1048576", "orch.prefix": "ab" * 32, "orch.sha256": "cd" * 32}),
]


def members() -> list[tuple[tarfile.TarInfo, bytes]]:
    out = []
    for i, (name, what, mode, pax) in enumerate(MEMBERS):
        info = tarfile.TarInfo(name)
        info.mode, info.pax_headers = mode, dict(pax)
        if isinstance(what, str):
            info.type, info.linkname, data = tarfile.SYMTYPE, what, b""
        else:
            data = bytes((i + k) % 251 for k in range(what))
            info.size = what
        out.append((info, data))
    return out


def ours() -> bytes:
    out, written = io.BytesIO(), 0
    for info, data in members():
        head = tarstream.header(info)
        out.write(head + data + tarstream.padding(len(data)))
        written += len(head) + len(data) + len(tarstream.padding(len(data)))
    out.write(tarstream.end(written))
    return out.getvalue()


def test_every_kind_of_member_reads_back_through_tarfile_as_it_was_written() -> None:
    stream = ours()
    assert len(stream) % tarstream.RECORD == 0
    with tarfile.open(fileobj=io.BytesIO(stream), mode="r|", encoding="utf-8", errors="surrogateescape") as tar:
        got = []
        for member in tar:
            data = tar.extractfile(member).read() if member.isfile() else b""
            got.append((member.name, member.type, member.linkname, member.mode, member.size, data,
                        {k: v for k, v in member.pax_headers.items() if k.startswith("orch.")}))
    want = [(info.name, info.type, info.linkname, info.mode, info.size, data, info.pax_headers)
            for info, data in members()]
    assert got == want


def test_the_common_members_header_is_the_block_tarfile_writes() -> None:
    common = [(info, data) for info, data in members() if not info.pax_headers and info.name.isascii()
              and len(info.name) <= 100 and len(info.linkname) <= 100]
    assert len(common) == 6
    for info, _ in common:
        assert tarstream.header(info) == info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        assert len(tarstream.header(info)) == tarstream.BLOCK  # no pax record in front


@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 10240 - 1536])
def test_a_stream_ends_with_two_zero_blocks_on_a_whole_record(size: int) -> None:
    info = tarfile.TarInfo("f")
    info.size = size
    body = tarstream.header(info) + bytes(size) + tarstream.padding(size)
    stream = body + tarstream.end(len(body))
    assert len(stream) % tarstream.RECORD == 0 and stream[len(body):len(body) + 1024] == bytes(1024)
    assert len(stream) - len(body) >= 1024


def test_gnu_tar_lists_and_extracts_the_stream(tmp_path: Path) -> None:
    (tmp_path / "s.tar").write_bytes(ours())
    listed = subprocess.run(["tar", "--warning=no-unknown-keyword", "-tf", "s.tar"], cwd=tmp_path, capture_output=True, check=True)
    assert len(listed.stdout.splitlines()) == len(MEMBERS) and not listed.stderr
    out = tmp_path / "x"
    out.mkdir()
    subprocess.run(["tar", "--warning=no-unknown-keyword", "-xpf", "../s.tar"], cwd=out, check=True, capture_output=True)
    for info, data in members():
        path = out / info.name
        if info.issym():
            assert path.is_symlink() and str(path.readlink()) == info.linkname
        else:
            assert path.read_bytes() == data and path.stat().st_mode & 0o777 == info.mode

"""``ByteQueue`` against a plain ``bytes`` reference: random puts, takes and line reads give
the same bytes in the same order, and a take of exactly the first chunk is that chunk."""

from __future__ import annotations

import random

from remote_payload.contract.bytequeue import ByteQueue


def test_random_operations_match_a_bytes_reference() -> None:
    rng = random.Random(26)
    for _ in range(200):
        q, ref = ByteQueue(), b""
        for _ in range(60):
            op = rng.random()
            if op < 0.4:
                data = bytes(rng.choice(b"ab\n") for _ in range(rng.randrange(0, 40)))
                q.put(data if rng.random() < 0.8 else bytearray(data))
                ref += data
            elif op < 0.8:
                n = rng.randrange(-1, 50)
                got = q.take(n)
                want = ref if n < 0 else ref[:n]
                ref = ref[len(want):]
                assert got == want and type(got) is bytes
            else:
                limit = rng.randrange(0, 30)
                at = ref.find(b"\n", 0, limit + 1)
                got = q.line(limit)
                if at < 0:
                    assert got is None
                else:
                    assert got == ref[:at]
                    ref = ref[at + 1:]
            assert len(q) == len(ref)
        assert q.take() == ref


def test_a_whole_chunk_is_handed_on_uncopied_and_spans_are_joined() -> None:
    big = bytes(range(256)) * 4096
    q = ByteQueue()
    q.put(big)
    assert q.take(len(big)) is big
    q.put(b"abc")
    q.put(b"def")
    assert q.take(2) == b"ab"
    assert q.take(3) == b"cde"
    assert q.find(b"f", 10) == 0 and q.find(b"x", 10) == -1
    assert q.take(10) == b"f" and len(q) == 0 and q.take(5) == b""


def test_find_looks_only_within_the_limit() -> None:
    q = ByteQueue(b"0123")
    q.put(b"45\n7")
    assert q.find(b"\n", 6) == -1 and q.find(b"\n", 7) == 6
    assert q.line(5) is None and q.line(6) == b"012345" and len(q) == 1

"""The holder's wire format: frames sent without copying their payload (``wire.send_frame``)."""

from __future__ import annotations

import os
import socket
import threading

from orchestrator.holder.wire import Reader, frame, send_frame


def test_a_frame_sent_in_pieces_arrives_whole_and_in_order() -> None:
    payloads = [b"", b"x", os.urandom(300_000), os.urandom(1 << 20)]
    sender, receiver = socket.socketpair()
    with sender, receiver:
        # A small buffer and a timeout: each sendmsg takes what fits, often part of a header
        # or of a payload, and the rest must follow from where it stopped.
        sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sender.settimeout(30)
        got: list[tuple[bytes, bytes] | None] = []

        def read() -> None:
            reader = Reader(receiver)
            for _ in range(len(payloads) + 1):
                got.append(reader.frame())

        reading = threading.Thread(target=read)
        reading.start()
        for i, payload in enumerate(payloads):
            send_frame(sender, b"I", memoryview(payload) if i % 2 else payload)
        sender.sendall(frame(b"F"))
        sender.shutdown(socket.SHUT_WR)
        reading.join(30)
        assert got == [(b"I", p) for p in payloads] + [(b"F", b"")]

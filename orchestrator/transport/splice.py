"""``splice``: copy two byte streams into each other until both directions ended.

Used where a forwarded TCP connection meets the SSH channel that carries it: ``orch tunnel``'s
local connections (``orchestrator/tunnel/``) and the connection holder's forwards
(``orchestrator/holder/commands.py``). A stream is a socket or a paramiko channel: ``recv``,
``sendall``, ``close``, and a way to end its write side (``shutdown_write`` on a channel,
``shutdown(SHUT_WR)`` on a socket). One direction at its end (EOF, or an error: a cut link)
ends the other side's writing, so a half-closed HTTP exchange still gets its answer; both
streams are closed once both directions ended.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

CHUNK = 1 << 16


def end_writing(stream: Any) -> None:
    """No more bytes will be sent on ``stream`` (the peer reads EOF); never raises."""
    try:
        if hasattr(stream, "shutdown_write"):
            stream.shutdown_write()
        else:
            stream.shutdown(socket.SHUT_WR)
    except Exception:  # noqa: BLE001 - a stream that is already gone: nothing left to end
        pass


def close(stream: Any) -> None:
    try:
        stream.close()
    except Exception:  # noqa: BLE001 - closing what is already closed or broken
        pass


def _copy(src: Any, dst: Any, broken: threading.Event) -> None:
    try:
        while not broken.is_set() and (data := src.recv(CHUNK)):
            dst.sendall(data)
    except Exception:  # noqa: BLE001 - either side failed (a cut link, a reset): the pair ends
        broken.set()
        close(src)
        close(dst)
        return
    end_writing(dst)


def splice(a: Any, b: Any, wait: bool = True) -> threading.Thread:
    """Copy ``a`` into ``b`` and ``b`` into ``a`` on two threads; both closed when both
    directions ended (or at once when either failed). ``wait``: return only then. Returns
    the thread that closes them."""
    broken = threading.Event()

    def run() -> None:
        other = threading.Thread(target=_copy, args=(b, a, broken), daemon=True)
        other.start()
        _copy(a, b, broken)
        other.join()
        close(a)
        close(b)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    if wait:
        thread.join()
    return thread

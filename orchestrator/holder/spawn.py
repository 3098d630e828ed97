"""Starting, finding and stopping connection holders (``orchestrator.holder.daemon``).

``spawn`` starts one in the background after a command connected directly; ``running`` and
``stop_holders`` serve ``orch hosts disconnect`` and the tests. Nothing here imports paramiko.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from orchestrator import __version__
from orchestrator.holder.wire import ask, holder_folders, lock_free, place
from orchestrator.home import orch_home
from orchestrator.hosts.inventory import Host

ORCH_SOURCE = Path(__file__).resolve().parents[2]  # holds the orch this CLI runs: a holder imports that one


def spawn(host: Host, warm: Sequence[str] | None = None) -> None:
    """Start a holder for ``host`` in the background, detached from this terminal; nothing
    when one holds its lock already (running or still connecting). ``warm``: an argv the holder
    starts a spare of as soon as it is connected (orch's helper), so the next command finds one
    ready instead of paying for its start. Never raises."""
    try:
        where = place(host)
        if where is None or not lock_free(where.lock):
            return
        src = str(ORCH_SOURCE)
        code = f"import sys; p = {src!r}; p in sys.path or sys.path.insert(0, p); import orchestrator.holder.daemon as h; h.main()"
        env = {**os.environ, "ORCH_HOME": str(orch_home().resolve()), "ORCH_HOLD_HOST": host.model_dump_json(),
               "ORCH_HOLD_VERSION": __version__, "ORCH_HOLD_WARM": json.dumps(list(warm or []))}
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, cwd="/", env=env)
        threading.Thread(target=proc.wait, daemon=True).start()  # reaped if it ends while we run
    except (OSError, ValueError):
        pass


def running(home: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every live holder of ``home``: its socket and its answer to ``ping``."""
    home = home.resolve()
    found = []
    for folder in holder_folders(home):
        for sock in sorted(folder.glob("*.sock")) if folder.is_dir() else []:
            try:
                info = ask(sock, "ping", timeout=2)
            except (OSError, ValueError):
                continue
            if info.get("home") == str(home):
                found.append((sock, info))
    return found


def stop_holders(home: Path, target: str | None = None, wait_s: float = 10) -> int:
    """Ask ``home``'s holders (only those of ``target``, ``user@address:port``, when given)
    to stop; wait up to ``wait_s`` for their sockets to go. How many were asked."""
    asked = []
    for sock, info in running(home):
        if target is None or info.get("target") == target:
            try:
                ask(sock, "stop", timeout=2)
                asked.append(sock)
            except (OSError, ValueError):
                pass
    deadline = time.monotonic() + wait_s
    while any(s.exists() for s in asked) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(asked)

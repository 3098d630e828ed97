"""Cache of each SSH host's interpreter as an absolute path (``ORCH_HOME/pythons.json``).

Keyed by the host entry's name, address, port, user and configured python, so editing the
entry invalidates it. Losing the cache only costs a login shell on the next command.
"""

from __future__ import annotations

import json
import threading

from orchestrator.home import orch_home, write_private
from orchestrator.hosts import Host

_lock = threading.Lock()


def _key(host: Host) -> str:
    return f"{host.name}|{host.user}@{host.address}:{host.port}|{host.python}"


def _load() -> dict[str, str]:
    try:
        data = json.loads((orch_home() / "pythons.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(data, dict) else {}


def get(host: Host) -> str | None:
    return _load().get(_key(host))


def _save(update: dict[str, str | None]) -> None:
    with _lock:
        data = _load()
        for key, value in update.items():
            if value is None:
                data.pop(key, None)
            else:
                data[key] = value
        write_private(orch_home() / "pythons.json", json.dumps(data, indent=1) + "\n")


def put(host: Host, path: str) -> None:
    _save({_key(host): path})


def forget(host: Host) -> None:
    _save({_key(host): None})

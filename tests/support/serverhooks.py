"""The test harness's settings for orch's server code (remote_payload/contract/testhooks.py).

A test turns a server-side hook on by writing ``test-hooks.json`` straight into a host's orch
root, never through a job file: ``env:`` with an ``ORCH_`` name is refused (exit 2), and the
server reads its hooks from that file only. Every test has its own roots (``orch.home/local``,
``orch.remote_root``, ...), so a setting ends with the test that wrote it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from remote_payload.contract import testhooks
from tests.support.orch import Orch


def host_root(orch: Orch, host: str) -> Path:
    """The orch root of ``host``: ``local``'s, or the ``--root`` its inventory entry names."""
    if host == "local":
        return orch.home / "local"
    return Path(json.loads((orch.home / "hosts" / f"{host}.json").read_text())["root"])


def set_hooks(root: Path, owner: str | None = None, **settings: Any) -> None:
    """Merge ``settings`` (``gpus=2``, ``gpus_busy=[0]``, ``step_delay_s=0.5``,
    ``clock_shift_s=3600``) into ``root``'s ``test-hooks.json``, creating the root when it is not
    there yet (owned by the login user ``owner`` when given, so its helper can use it)."""
    made = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    file = Path(testhooks.path(str(root)))
    current = json.loads(file.read_text()) if file.exists() else {}
    file.write_text(json.dumps({**current, **settings}))
    file.chmod(0o644)
    if owner is not None:
        import pwd

        user = pwd.getpwnam(owner)
        for path in ([root] if made else []) + [file]:
            os.chown(path, user.pw_uid, user.pw_gid)


def set_host_hooks(orch: Orch, host: str, **settings: Any) -> None:
    """``set_hooks`` on ``host``'s root."""
    set_hooks(host_root(orch, host), **settings)

"""Where orch keeps its own state on the laptop (``ORCH_HOME``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def orch_home() -> Path:
    """``$ORCH_HOME`` or the platform's user data dir; created 0700 on first use."""
    env = os.environ.get("ORCH_HOME")
    if env:
        home = Path(env).expanduser()
    elif sys.platform == "darwin":
        home = Path.home() / "Library" / "Application Support" / "orch"
    else:
        home = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "orch"
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    return home


def write_private(path: Path, data: str) -> None:
    """Write ``data`` to ``path`` atomically with mode 0600 (temp file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def laptop_id() -> str:
    """A random id of this laptop's orch (``ORCH_HOME/laptop-id``), made once: it keeps the
    server folders of two laptops' checkouts apart even when their paths are equal."""
    path = orch_home() / "laptop-id"
    try:
        value = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        value = ""
    if len(value) == 32 and all(c in "0123456789abcdef" for c in value):
        return value
    value = os.urandom(16).hex()
    write_private(path, value + "\n")
    return value

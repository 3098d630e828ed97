"""Where orch keeps its own state on the laptop (``ORCH_HOME``), and the private folders and
lock files of its background processes (connection holders, the warm server). Standard library
only: the ``orch`` entry point imports it before anything else."""

from __future__ import annotations

import fcntl
import os
import stat
import sys
from pathlib import Path

from orchestrator import settings

TYPE_CHECKING = False  # typing costs every command's start ~9 ms (orch's entry point imports this)
if TYPE_CHECKING:
    from typing import Callable


def orch_home() -> Path:
    """``$ORCH_HOME`` or the platform's user data dir; created 0700 on first use."""
    env = settings.HOME.get()
    if env:
        home = Path(str(env)).expanduser()
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


def private_folder(folder: Path) -> bool:
    """Create ``folder`` 0700 when missing; true only when it is a real directory (not a
    symlink) owned by this user that nobody else can enter."""
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077 == 0


def take_lock(path: Path) -> int | None:
    """Open (0600, never through a symlink: ``OSError``) and lock the lock file ``path``;
    its descriptor, which holds the lock until closed, or ``None`` when another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def lock_free(path: Path, then: Callable[[], None] = lambda: None) -> bool:
    """True when no process (a holder, a warm server) holds this lock or is starting with it;
    ``then`` runs while we hold it for that moment."""
    try:
        fd = take_lock(path)
    except OSError:
        return False
    if fd is None:
        return False
    try:
        then()
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # releases the lock

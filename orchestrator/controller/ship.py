"""orch shipped to a controller's host, content-addressed, and the bootstrap that runs it there.

Every command on the controller's host is ``[python, "-c", BOOT, root, hash, VERB, ...]``: BOOT
finds ``<root>/controller/code/<hash>/`` (exit 97 when it is missing), puts it first on
``sys.path`` and runs ``orchestrator.controller.host.main``. ``install`` unpacks a tar from stdin
into a temp folder and renames it into place, so a code folder is complete or absent. The tar
holds ``orchestrator/`` and ``remote_payload/`` exactly as this laptop runs them (its Python
files), so the controller runs the laptop's version; their dependencies (pydantic, PyYAML,
paramiko, click, rich) come from the host's Python (``host.py deps`` names what is missing).
"""

from __future__ import annotations

import hashlib
import io
import sys
import tarfile
from functools import lru_cache
from pathlib import Path

from orchestrator.hosts.inventory import Host
from orchestrator.transport import shell

MISSING_EXIT = 97
PACKAGES = ("orchestrator", "remote_payload")
SOURCE = Path(__file__).resolve().parents[2]

BOOT = r"""
import os, sys
os.umask(0o077)
root = os.path.expanduser(sys.argv[1]); h = sys.argv[2]
folder = os.path.join(root, "controller")
d = os.path.join(folder, "code", h)
if sys.argv[3] == "install":
    import shutil, tarfile, tempfile
    parent = os.path.join(folder, "code")
    os.makedirs(parent, exist_ok=True)
    t = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    tarfile.open(fileobj=sys.stdin.buffer, mode="r|").extractall(t, **kw)
    try:
        os.rename(t, d)
    except OSError:
        shutil.rmtree(t)
    sys.exit(0)
if not os.path.isfile(os.path.join(d, "orchestrator", "controller", "host.py")):
    sys.exit(97)
sys.path.insert(0, d)
from orchestrator.controller.host import main
sys.exit(main(folder, d, sys.argv[3:]))
""".strip()


def _files() -> list[Path]:
    return sorted(p for name in PACKAGES for p in (SOURCE / name).rglob("*.py") if "__pycache__" not in p.parts)


@lru_cache(maxsize=1)
def code_hash() -> str:
    """sha256 over the shipped files' relative paths and contents (first 16 hex digits)."""
    h = hashlib.sha256()
    for path in _files():
        h.update(str(path.relative_to(SOURCE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def code_tar() -> bytes:
    """The shipped files as an uncompressed tar, ``orchestrator/`` and ``remote_payload/`` at its top."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in _files():
            info = tarfile.TarInfo(str(path.relative_to(SOURCE)))
            data = path.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o600, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def python_of(host: Host) -> str:
    return sys.executable if host.kind == "local" else host.python


def plain_argv(host: Host, verb: str, *args: str) -> list[str]:
    """The host-side command ``verb`` without the login shell (what ``start.sh`` runs inside one)."""
    return [python_of(host), "-c", BOOT, host.root, code_hash(), verb, *args]


def argv(host: Host, verb: str, *args: str) -> list[str]:
    """The host-side command ``verb``; on an SSH host through ``bash -l`` (conda's PATH, the
    profile's variables: the same environment as orch's helper)."""
    words = plain_argv(host, verb, *args)
    return words if host.kind == "local" else shell.login_argv(words)


def start_script(host: Host) -> str:
    """``start.sh``'s text: starts the controller when none runs (what ``@reboot`` runs)."""
    words = argv(host, "start")
    return "#!/bin/sh\n# orch controller: start it when none runs (written by orch controller up)\nexec " \
        + shell.join(words) + "\n"

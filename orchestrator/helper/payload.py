"""``remote_payload`` shipped content-addressed, and the bootstrap that runs its agent.

Every helper is ``[python, "-c", BOOT, root, hash, "serve"]``: BOOT finds
``<root>/payload/<hash>/remote_payload`` (exit 97 when it is missing), puts it on
``sys.path`` and runs ``serve.main`` (requests in sessions: ``remote_payload/contract/protocol.py``). ``install`` unpacks a tar from stdin into a temp
folder and renames it into place, so a payload folder is complete or absent. When it cannot
create that folder (root not writable) it exits 98 with one stderr line
``orch-root-unwritable<TAB>expanded root<TAB>reason`` and no traceback. BOOT sets umask 077
first: everything orch creates on a server is its owner's only (``remote_payload/jobdir/private.py``).
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from functools import lru_cache
from pathlib import Path

from remote_payload import contract

MISSING_EXIT = 97
ROOT_EXIT = 98            # install could not create <root>/payload: stderr has ROOT_MARKER
ROOT_MARKER = "orch-root-unwritable"

BOOT = r"""
import os, sys
os.umask(0o077)
root = os.path.expanduser(sys.argv[1]); h = sys.argv[2]
d = os.path.join(root, "payload", h)
if sys.argv[3] == "install":
    import shutil, tarfile, tempfile
    parent = os.path.join(root, "payload")
    try:
        os.makedirs(parent, exist_ok=True)
        t = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    except OSError as e:
        sys.stdin.buffer.read()
        sys.stderr.write("orch-root-unwritable\t%s\t%s\n" % (root, e.strerror or e))
        sys.exit(98)
    kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    tarfile.open(fileobj=sys.stdin.buffer, mode="r|").extractall(t, **kw)
    try:
        os.rename(t, d)
    except OSError:
        shutil.rmtree(t)
    sys.exit(0)
if not os.path.isfile(os.path.join(d, "remote_payload", "helper", "serve.py")):
    sys.exit(97)
sys.path.insert(0, d)
from remote_payload.helper.serve import main
sys.exit(main(root, d, sys.argv[3:]))
""".strip()


def _files() -> list[Path]:
    base = Path(contract.__file__).parent.parent
    return sorted(p for p in base.rglob("*.py") if "__pycache__" not in p.parts)


@lru_cache(maxsize=1)
def payload_hash() -> str:
    """sha256 over the payload's relative paths and contents (first 16 hex digits)."""
    base = Path(contract.__file__).parent.parent
    h = hashlib.sha256()
    for path in _files():
        h.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def payload_tar() -> bytes:
    """The payload as an uncompressed tar with ``remote_payload/`` at its top."""
    base = Path(contract.__file__).parent.parent
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in _files():
            info = tarfile.TarInfo("remote_payload/" + str(path.relative_to(base)))
            data = path.read_bytes()
            info.size, info.mode, info.mtime = len(data), 0o600, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()

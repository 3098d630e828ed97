"""What earlier fetches of a job verified, so a fetch with nothing new costs one round trip.

``ORCH_HOME/fetched/<digest of the destination folder's real path>.json`` = {"files": {name:
[size, mtime_ns, sha256]}, "told": [host]} (kept out of the destination, which holds only what
was fetched and orch's marker).
A local file whose size and modification time still equal its row was verified against that
sha256 when it was written (rsync's quick check: an edit changes the mtime), so it is not read
again; any other file is hashed as before. ``told``: hosts already told that this job's outputs
are on the laptop (the ``fetched`` request, which ``on_finish: shutdown`` waits for; the
server keeps that mark for good). A missing or broken record only means more hashing.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from orchestrator.home import orch_home, write_private
from orchestrator.sync import sha256_of

class FetchState:
    def __init__(self, dest: Path) -> None:
        digest = hashlib.sha256(os.path.realpath(dest).encode()).hexdigest()[:24]
        self.path = orch_home() / "fetched" / f"{digest}.json"
        try:
            data: Any = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        files = data.get("files") if isinstance(data, dict) else None
        told = data.get("told") if isinstance(data, dict) else None
        self.files: dict[str, list[Any]] = files if isinstance(files, dict) else {}
        self.told: set[str] = {t for t in told if isinstance(t, str)} if isinstance(told, list) else set()
        self.dirty = False

    def has(self, name: str, local: Path, size: int, sha256: str) -> bool:
        """True when ``local`` holds ``size`` bytes with ``sha256`` (hashed only when its size
        or mtime moved since it was verified)."""
        try:
            st = local.stat()
        except OSError:
            return False
        if st.st_size != size:
            return False
        if self.files.get(name) == [st.st_size, st.st_mtime_ns, sha256]:
            return True
        if sha256_of(local) != sha256:
            return False
        self.files[name], self.dirty = [st.st_size, st.st_mtime_ns, sha256], True
        return True

    def verified(self, name: str, local: Path, sha256: str) -> None:
        """``local`` was just written and checked against ``sha256``."""
        st = local.stat()
        self.files[name], self.dirty = [st.st_size, st.st_mtime_ns, sha256], True

    def tell(self, host: str) -> None:
        """``host`` now knows the outputs are here."""
        self.told.add(host)
        self.dirty = True

    def save(self) -> None:
        """Write the record, when anything in it changed."""
        if not self.dirty:
            return
        try:
            write_private(self.path, json.dumps({"files": self.files, "told": sorted(self.told)}))
        except OSError:
            pass  # a record to save work: without it the next fetch hashes again

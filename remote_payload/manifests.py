"""The supervisor's manifest bookkeeping while a job runs (standard library only).

``ManifestCache`` builds the job folder's manifest in the background, so the manifest written
at the end (before the terminal state) hashes only what is new or changed since; ``Flock``
serialises ``manifest.json`` writes between supervisors of one job folder (an earlier
attempt's late refresh never crosses a later attempt's final write).
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from typing import Any, Dict, Optional

from remote_payload.common import build_manifest

MANIFEST_DUTY = 4.0  # the background build sleeps at least this many times as long as a build took
SETTLE_S = 2.0  # the background build reads only files unchanged for this long before it began


class ManifestCache:
    """Builds the job folder's manifest in a background thread while the job runs, so the one
    built at the end re-hashes only files that are new or changed since (``build_manifest``
    keeps the hash of a file whose size and mtime are unchanged). It never writes
    ``manifest.json``: ``latest`` is only a cache of hashes, and it hashes only files that had
    settled (unmodified for ``SETTLE_S``) when the build began — a file the job may still be
    writing is never read here, and is hashed at the end."""

    def __init__(self, job_dir: str, period: float, previous: Optional[Dict[str, Any]]) -> None:
        self.job_dir, self.period = job_dir, period
        self.latest: Optional[Dict[str, Any]] = previous
        self.stopping = threading.Event()
        threading.Thread(target=self._run, name="orch-manifest", daemon=True).start()

    def _run(self) -> None:
        pause = self.period
        while not self.stopping.wait(pause):
            t0 = time.time()
            try:
                self.latest = build_manifest(self.job_dir, self.latest, int((t0 - SETTLE_S) * 1e9))
            except Exception:  # noqa: BLE001 - a cache: the manifest at the end is the one that counts
                pass
            pause = max(self.period, MANIFEST_DUTY * (time.time() - t0))

    def stop(self) -> Optional[Dict[str, Any]]:
        """Stop building (a build in progress is not waited for); the newest manifest built."""
        self.stopping.set()
        return self.latest


class Flock:
    """``with Flock(folder):`` holds an exclusive flock on ``folder`` (Linux: a directory
    can be flocked); a folder that cannot be opened is not locked."""

    def __init__(self, folder: str) -> None:
        self.folder, self.fd = folder, -1

    def __enter__(self) -> "Flock":
        try:
            self.fd = os.open(self.folder, os.O_RDONLY)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:
            pass
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing releases the lock

"""Room for a job's last words on a full disk (Linux, standard library only).

A job may fill the disk its folder is on; its end must still be recorded. The supervisor
therefore sets ``RESERVE_BYTES`` aside at its start (``Reserve.make``: a file of zeros,
``jobfolder.STATUS_RESERVE``, never listed nor moved) and gives them up the moment a write of
its own meets a full disk (``Reserve.release``), so the terminal status.json (a few KiB) fits.

``disk_full`` says whether an error is the disk's (ENOSPC, EDQUOT); ``full_at`` whether the
filesystem holding a path is full (under ``FULL_BELOW`` free for an unprivileged writer).
"""

from __future__ import annotations

import errno
import os
from typing import Optional

from remote_payload.contract.jobfolder import STATUS_RESERVE

RESERVE_BYTES = 256 * 1024
FULL_BELOW = 64 * 1024  # a filesystem with less free than this is full: a manifest or a log line may not fit
FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in FULL


def full_at(path: str) -> Optional[str]:
    """``"PATH: N bytes free"`` when ``path``'s filesystem is full, else None (also when unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    free = st.f_bavail * st.f_frsize
    return "%s: %d bytes free on its filesystem" % (path, free) if free < FULL_BELOW else None


class Reserve:
    """``RESERVE_BYTES`` held in ``<job_dir>/.status.reserve`` until ``release``."""

    def __init__(self, job_dir: str) -> None:
        self.path = os.path.join(job_dir, STATUS_RESERVE)

    def make(self) -> bool:
        """Write the reserve (zeros, synced, so the blocks are really taken); False, and no
        file left, when the disk has no room for it already."""
        try:
            with open(self.path, "wb") as f:
                f.write(b"\0" * RESERVE_BYTES)
                f.flush()
                os.fsync(f.fileno())
            return True
        except OSError:
            self.release()
            return False

    def release(self) -> bool:
        """Give the reserved blocks back; True when there was a reserve to give."""
        try:
            os.unlink(self.path)
            return True
        except OSError:
            return False

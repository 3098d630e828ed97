"""Who may read what orch keeps on a server: the user orch logs in as, no one else (standard
library only, Python >= 3.8). docs/own-script.md, "Secrets", states it for users.

- Every process orch starts there runs with umask 077 (``UMASK``): the helper (set by the
  bootstrap, ``orchestrator/helper/payload.py``), so the supervisor and the job it starts,
  ``sbatch`` (Slurm runs the batch step with the submitter's umask) and the supervisor again
  in a Slurm allocation. What they create is 0600 (files) and 0700 (folders): job.json,
  status.json, ``repro/``, ``logs/`` (Slurm's output files too), metrics, checkpoints, outputs,
  ``slurm.sh``, the GPU queue's files, leases, move staging, the sync record. A job that wants
  to share a file sets its own umask (in setup or its command).
- A workspace file received from the laptop keeps its owner's permission bits only
  (``helper/workspace.py``); the job's ``code/`` snapshot hard-links those files, and a hard
  link is the same inode, so it has the same private mode.
- ``make_private``: the root and the folders orch keeps in it lose every group and other bit
  at each helper start, so a root an earlier orch made 0755 turns private; nothing below a
  0700 folder is reachable by another user, whatever its own mode. A root that is the login
  user's home folder itself is left as it is (its folders are made private).
"""

from __future__ import annotations

import os
import stat

UMASK = 0o077
FOLDERS = ("jobs", "workspace", "payload", "queue", "state", "staged")


def make_private(root: str) -> None:
    """``root`` (unless it is the home folder) and its ``FOLDERS`` to mode & 0700; what is
    missing, not this user's, or cannot be changed is left alone."""
    home = os.path.realpath(os.path.expanduser("~"))
    paths = [os.path.join(root, name) for name in FOLDERS]
    if os.path.realpath(root) != home:
        paths.insert(0, root)
    for path in paths:
        try:
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
                os.chmod(path, stat.S_IMODE(st.st_mode) & 0o700)
        except OSError:
            continue

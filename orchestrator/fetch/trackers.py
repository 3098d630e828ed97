"""``orch fetch JOB --wandb-sync``: upload the fetched offline Weights & Biases runs with ``wandb sync``.

Contract: ``offline_runs(folder)`` lists the offline run folders a fetch brought
(``wandb/offline-run-*`` anywhere below ``folder``, sorted; never through a symlink: ``latest-run``
is one). ``sync(folder, say)`` runs the laptop's ``wandb`` executable (found on PATH) as
``wandb sync RUN...`` with every one of them, its output on stderr, and returns its exit status;
without offline runs it says so and returns 0; without ``wandb`` on the laptop it says so, with
the command to run once it is installed, and returns ``NOT_INSTALLED``. Nothing is imported
from wandb: it is the user's tool, run as they would run it.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

NOT_INSTALLED = 1


def offline_runs(folder: Path) -> list[Path]:
    """The fetched ``wandb/offline-run-*`` folders below ``folder`` (see the module contract)."""
    found = []
    for wandb_dir in sorted(p for p in folder.rglob("wandb") if p.is_dir() and not p.is_symlink()):
        found += [p for p in sorted(wandb_dir.glob("offline-run-*")) if p.is_dir() and not p.is_symlink()]
    return found


def sync(folder: Path, say: Callable[[str], None]) -> int:
    """``wandb sync`` the offline runs under ``folder`` (see the module contract); its exit status."""
    runs = offline_runs(folder)
    if not runs:
        say(f"--wandb-sync: no offline W&B run (wandb/offline-run-*) in {folder}: the job's outputs: must select "
            "wandb/ (a script run with WANDB_MODE=offline writes it in its working directory)")
        return 0
    argv = ["wandb", "sync", *map(str, runs)]
    exe = shutil.which("wandb")
    if exe is None:
        say(f"--wandb-sync: wandb is not installed on this laptop, so {len(runs)} offline run(s) stay unsynced; "
            f"pip install wandb, then: {shlex.join(argv)}")
        return NOT_INSTALLED
    say(f"--wandb-sync: {shlex.join(argv)}")
    done = subprocess.run([exe, *argv[1:]], stdout=sys.stderr, stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        say(f"--wandb-sync: wandb sync exited {done.returncode}")
    return done.returncode

"""Where a controller keeps its files on its host: ``<root>/controller/`` (``Layout``).

Standard library only: the host side's entry (``host.py``) reads it before it knows whether the
laptop package's dependencies are there.

    <root>/controller/
        code/<hash>/            orch as the laptop that ran ``orch controller up`` runs it (content-addressed)
        home/                   the controller's own ORCH_HOME: registry, host entries, kits of managed jobs
        controller.lock         the lease: held (flock) by the one running controller for its whole life
        controller.json         the running controller's pid, code, version and start time (no secret)
        controller.log          what it did, one timestamped line per event
        settings.json           the ORCH_* settings it runs with (from the laptop at ``up``; no secret)
        secret-names.json       the names of the secrets it needs (never a value)
        start.sh                the command that starts it (what the crontab's @reboot line runs)
        ctl.sock                its socket (in the temp folder when this path is too long for one)
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

SOCK_MAX = 100  # bytes of a socket path (sun_path: 104 on macOS, 108 on Linux, with NUL)


@dataclass(frozen=True)
class Layout:
    """The controller folder ``folder`` (``<root>/controller``, expanded)."""

    folder: Path

    @property
    def home(self) -> Path:
        return self.folder / "home"

    @property
    def lock(self) -> Path:
        return self.folder / "controller.lock"

    @property
    def info(self) -> Path:
        return self.folder / "controller.json"

    @property
    def log(self) -> Path:
        return self.folder / "controller.log"

    @property
    def settings(self) -> Path:
        return self.folder / "settings.json"

    @property
    def secret_names(self) -> Path:
        return self.folder / "secret-names.json"

    @property
    def start_script(self) -> Path:
        return self.folder / "start.sh"

    @property
    def sock(self) -> Path:
        """``ctl.sock`` in the folder, or a name of the folder's own in a private temp folder
        when that path is too long for a Unix socket."""
        here = self.folder / "ctl.sock"
        if len(os.fsencode(here)) <= SOCK_MAX:
            return here
        key = hashlib.sha256(os.fsencode(self.folder)).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"orch-{os.getuid()}" / f"ctl-{key}.sock"

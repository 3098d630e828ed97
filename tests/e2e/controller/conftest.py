"""Fixtures of the controller tests: a controller that is stopped after each test, and a
stand-in ``crontab`` (the user-level crontab command's ``-l`` and ``-`` as cronie and Vixie
cron answer them: the table on stdout, 'no crontab for USER' and exit 1 when there is none;
a new table read from stdin)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.orch import Orch

CRONTAB = """#!/bin/sh
if [ "$1" = "-l" ]; then
  [ -f "$CRONTAB_FILE" ] && exec cat "$CRONTAB_FILE"
  echo "no crontab for $(id -un)" >&2; exit 1
fi
if [ "$1" = "-" ]; then cat > "$CRONTAB_FILE"; exit 0; fi
echo "usage: crontab [-l | -]" >&2; exit 1
"""


def controller_pid(orch: Orch, host: str) -> int | None:
    status = orch.json("controller", "status", host, check=None)
    return status.get("pid") if status.get("running") else None


@pytest.fixture
def controllers(orch: Orch) -> Iterator[list[str]]:
    """Hosts a test started a controller on (append the name): stopped after the test, and a
    controller that would not stop is killed."""
    started: list[str] = []
    yield started
    for host in started:
        pid = controller_pid(orch, host)
        orch("controller", "down", host, check=None)
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def crontab(tmp_path: Path, orch: Orch) -> Path:
    """A stand-in ``crontab`` first on the PATH of orch's commands (and of the ``local`` host's);
    the table it keeps."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "crontab").write_text(CRONTAB)
    (bin_dir / "crontab").chmod(0o755)
    table = tmp_path / "crontab.txt"
    orch.env.update(PATH=f"{bin_dir}{os.pathsep}{orch.env.get('PATH', os.defpath)}", CRONTAB_FILE=str(table))
    return table

"""Fixtures of the controller tests: a controller that is stopped after each test (``controllers``),
a host behind the fault proxy (``flaky``) and a second host (``box2``) for managed jobs, and a
stand-in ``crontab`` (the user-level crontab command's ``-l`` and ``-`` as cronie and Vixie
cron answer them: the table on stdout, 'no crontab for USER' and exit 1 when there is none;
a new table read from stdin)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Iterator

import pytest

from tests.e2e.faults.conftest import flaky, proxy  # noqa: F401 - fixtures of the managed-job tests
from tests.e2e.move.conftest import box2  # noqa: F401
from tests.e2e.provider.conftest import vast  # noqa: F401 - the vast.ai stand-in rents replacements
from tests.support.orch import Orch
from tests.support.poll import wait_until

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


FAST = {"ORCH_CONTROLLER_CHECK_S": "0.5", "ORCH_LOST_AFTER_S": "3"}  # what the controller runs with (up forwards them)


def controller_home(orch: Orch) -> Path:
    """The ORCH_HOME of a controller started on ``local`` by ``orch``."""
    return orch.home / "local" / "controller" / "home"


def managed(orch: Orch, job_id: str) -> dict:
    """The job as ``orch controller status --json`` lists it ({} when it does not)."""
    jobs = orch.json("controller", "status")["jobs"]
    return next((j for j in jobs if j["job_id"] == job_id), {})


def wait_done(orch: Orch, job_id: str, timeout: float) -> dict:
    """The managed job once the controller is done with it (the controller's log on a timeout)."""
    return wait_until(lambda: managed(orch, job_id) if managed(orch, job_id).get("phase") == "done" else None,
                      what=f"the controller done with {job_id}", timeout=timeout,
                      detail=lambda: orch("controller", "logs", check=None).stdout)

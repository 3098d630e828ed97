"""The provider stand-ins (tests/support/standin/), one of each per module: real sshd instances.

Each instance logs in as a Unix user of its own; the names carry this pytest worker's tag
(``worker_tag``), so two modules whose stand-ins run at once on two workers (CI runs two) never
share a login user — one would otherwise reset the other's ``authorized_keys``.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import pytest

from tests.support.standin.autodl import AutoDLStandin
from tests.support.standin.boxes import StandinServer
from tests.support.standin.runpod import RunPodStandin
from tests.support.standin.vast import VastStandin
from tests.support.tiers import needs

S = TypeVar("S", bound=StandinServer)


def worker_tag() -> str:
    """``0`` on xdist worker gw0, ``1`` on gw1, ...; ``m`` without workers."""
    return os.environ.get("PYTEST_XDIST_WORKER", "").removeprefix("gw") or "m"


def serving(make: Callable[[Path, str], S]) -> Iterator[S]:
    """A stand-in made by ``make(workdir, token)``, served until the module ends."""
    workdir = Path(tempfile.mkdtemp(prefix="orch-standin-"))
    workdir.chmod(0o755)
    standin = make(workdir, "tok-" + secrets.token_hex(12))
    standin.start()
    yield standin
    standin.stop()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
@needs("root")
def autodl() -> Iterator[AutoDLStandin]:
    yield from serving(lambda workdir, token: AutoDLStandin(
        workdir, token, count=2, boot_delay_s=0.5, users=[f"orchsi{worker_tag()}n{i}" for i in range(2)],
        user_prefix=f"orchsc{worker_tag()}n"))


@pytest.fixture(scope="module")
@needs("root")
def vast() -> Iterator[VastStandin]:
    yield from serving(lambda workdir, token: VastStandin(
        workdir, token, boot_delay_s=0.3, user_prefix=f"orchsv{worker_tag()}n"))


@pytest.fixture(scope="module")
@needs("root")
def runpod() -> Iterator[RunPodStandin]:
    yield from serving(lambda workdir, token: RunPodStandin(
        workdir, token, boot_delay_s=0.3, user_prefix=f"orchsr{worker_tag()}n"))

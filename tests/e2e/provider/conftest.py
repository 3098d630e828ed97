"""The provider stand-ins (tests/support/standin/), one of each per module: real sshd instances."""

from __future__ import annotations

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
    yield from serving(lambda workdir, token: AutoDLStandin(workdir, token, count=2, boot_delay_s=0.5))


@pytest.fixture(scope="module")
@needs("root")
def vast() -> Iterator[VastStandin]:
    yield from serving(lambda workdir, token: VastStandin(workdir, token, boot_delay_s=0.3))


@pytest.fixture(scope="module")
@needs("root")
def runpod() -> Iterator[RunPodStandin]:
    yield from serving(lambda workdir, token: RunPodStandin(workdir, token, boot_delay_s=0.3))

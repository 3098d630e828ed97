"""The AutoDL stand-in (tests/support/standin/autodl.py), one per module: real sshd instances."""

from __future__ import annotations

import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.standin.autodl import AutoDLStandin


@pytest.fixture(scope="module")
def autodl() -> Iterator[AutoDLStandin]:
    workdir = Path(tempfile.mkdtemp(prefix="orch-standin-"))
    workdir.chmod(0o755)
    standin = AutoDLStandin(workdir, "tok-" + secrets.token_hex(12), count=2, boot_delay_s=0.5)
    standin.start()
    yield standin
    standin.stop()
    shutil.rmtree(workdir, ignore_errors=True)

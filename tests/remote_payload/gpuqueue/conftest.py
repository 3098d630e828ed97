"""The gate folder of the GPU queue's tests (tests/support/gpuqueue.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.gpuqueue import Gate


@pytest.fixture
def gate(tmp_path: Path) -> Gate:
    """An empty gate folder that the jobs' user can write (the sshd host runs them as root too)."""
    g = Gate(tmp_path / "gate")
    g.path.mkdir()
    g.path.chmod(0o777)
    return g

"""Fixtures of the sweep tests: a second host on the loopback sshd (another server's root)."""

from __future__ import annotations

import sys

import pytest

from tests.support.orch import Orch
from tests.support.sshd import SSHServer


@pytest.fixture
def box2(orch: Orch, sshd: SSHServer) -> str:
    """An inventory host ``box2``: the loopback sshd with a root of its own (another server)."""
    orch("hosts", "add", "box2", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root / "box2"), "--python", sys.executable, "--trust")
    return "box2"

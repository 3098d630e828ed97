"""Fault fixtures: a proxy in front of the loopback sshd, and a host `flaky` through it."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import Orch
from tests.faults.proxy import FaultProxy
from tests.sshd import SSHServer


@pytest.fixture
def proxy(sshd: SSHServer) -> FaultProxy:
    p = FaultProxy(sshd.port)
    yield p
    p.close()


@pytest.fixture
def flaky(orch: Orch, sshd: SSHServer, proxy: FaultProxy) -> str:
    """Host `flaky`: the loopback sshd reached through the fault proxy, key pinned."""
    orch("hosts", "add", "flaky", "--ssh", f"ssh -p {proxy.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root), "--python", sys.executable, "--trust")
    return "flaky"

"""Fault fixtures: a proxy in front of the loopback sshd, and a host `flaky` through it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.orch import Orch
from tests.support.proxy import FaultProxy
from tests.support.sshd import SSHServer


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


def start_paused(orch: Orch, spec: Path, point: str, hooks: Path) -> subprocess.Popen:
    """``orch submit SPEC`` in the background, held at pause point ``point`` (see
    orchestrator/testhooks.py) until the caller touches ``hooks/<point>.go``."""
    hooks.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "submit", str(spec)], cwd=orch.cwd,
                            env={**orch.env, "ORCH_TEST_PAUSE": f"{point}:{hooks}"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not (hooks / f"{point}.reached").exists() and time.time() < deadline:
        time.sleep(0.05)
    assert (hooks / f"{point}.reached").exists(), f"submit never reached {point}"
    return proc


"""The agent bridge against the loopback sshd: login shell only until the interpreter's path
is known, then only where the login environment matters; a stale cached path heals itself."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from orchestrator import pythons
from orchestrator.connect import open_transport
from orchestrator.hosts import Host
from orchestrator.remote import Remote
from tests.sshd import SSHServer


@pytest.fixture
def host(sshd: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Host:
    monkeypatch.setenv("ORCH_HOME", str(tmp_path / "home"))
    return Host(name="box", address="127.0.0.1", port=sshd.port, user="root", identity_file=str(sshd.client_key),
                root=str(tmp_path / "remote"), python=sys.executable, host_key=sshd.host_key_line)


def test_login_shell_until_the_interpreter_is_known(host: Host) -> None:
    with open_transport(host, None, lambda fp: False) as transport:
        remote = Remote(host, transport)
        assert remote.argv("status", "x")[:2] == ["bash", "-lc"]
        hello = remote.call("hello")
        assert pythons.get(host) == hello["python"]
        assert remote.argv("status", "x")[0] == hello["python"]
        assert remote.argv("launch")[:2] == ["bash", "-lc"] and remote.argv("hello", "p", "--gpus")[0] == "bash"
    with open_transport(host, None, lambda fp: False) as transport:  # a later orch command
        assert Remote(host, transport).argv("manifest", "x")[0] == hello["python"]


def test_a_stale_cached_interpreter_falls_back_to_the_login_shell(host: Host) -> None:
    pythons.put(host, "/nonexistent/python3")
    with open_transport(host, None, lambda fp: False) as transport:
        remote = Remote(host, transport)
        assert remote.call("status", "nojob")["jobs"]["nojob"]["state"] == "unknown"
        assert remote.direct is None or remote.direct != "/nonexistent/python3"
    assert pythons.get(host) != "/nonexistent/python3"

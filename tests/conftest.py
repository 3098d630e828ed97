"""Shared fixtures: a real sshd on loopback, an isolated ORCH_HOME, and an ``orch`` runner
that runs the real CLI in a subprocess (real exit codes, real stderr; tests/support/orch.py).
The test tiers' hooks (markers ``root``, ``netns``, ``slurm``; ``--fast``; no skips) live in
tests/support/tiers.py and are registered here."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator
from unittest.mock import patch

import pytest

from orchestrator.access.connect import open_transport
from orchestrator.helper.remote import Remote
from orchestrator.hosts.inventory import Host
from tests.support.orch import HOLD_IDLE_S, REPO, Orch, stop_holders
from tests.support.sshd import SSHServer, start_sshd
from tests.support.tiers import (  # noqa: F401 - pytest hooks, registered by being here
    needs, pytest_addoption, pytest_collection_modifyitems, pytest_configure, pytest_configure_node,
    pytest_report_collectionfinish, pytest_runtest_makereport, pytest_runtest_protocol, pytest_runtest_setup,
    pytest_terminal_summary, pytest_unconfigure, pytest_xdist_node_collection_finished)

# Every `python -m orchestrator` a test starts runs this checkout's code, whatever an editable
# install elsewhere points at (a second worktree of the repository, say).
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)

# pytest-xdist's workers set COLUMNS and LINES (80x24); orch's output piped to a test is then fitted
# to 80 columns (`orch status` shortens job ids). Tests run orch as a script does: no terminal size.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

# A suite started in the background (`cmd &` in a script) inherits SIGINT ignored, and so would
# every `orch` it starts: the Ctrl-C tests then test nothing. A handler (not SIG_IGN) here makes
# each child start with SIGINT at its default, as a terminal gives it.
signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def same_umask() -> Iterator[None]:
    """Each test ends with the umask it began with. Tests that run orch's server side in this
    process (the helper, the supervisor, the holder set 077 there, as they must) would otherwise
    leave it to every later test: a Slurm cluster started after them made its munge folder
    0700 and munged refused it — only when those tests ran first."""
    mask = os.umask(0o022)
    os.umask(mask)
    yield
    os.umask(mask)


@pytest.fixture(scope="session", autouse=True)
def laptop_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """ORCH_HOME for code the tests run in-process: never the real user's."""
    home = tmp_path_factory.mktemp("orch-home")
    with patch.dict(os.environ, {"ORCH_HOME": str(home), "ORCH_HOLD_IDLE_S": HOLD_IDLE_S,
                                 "ORCH_WARM_IDLE_S": HOLD_IDLE_S}):
        yield home
        stop_holders(home)


@pytest.fixture(scope="session", autouse=True)
def stale_shell_locks() -> Iterator[None]:
    """Machine hygiene, not orch behaviour: where pyenv sets up login shells, a shell killed by
    a test's cut link can leave pyenv's rehash lock behind, and every later ``bash -l`` (each
    helper start) then waits 60 s for it. A lock older than 15 s has no live holder: remove it."""
    lock = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "shims" / ".pyenv-shim"
    done = threading.Event()

    def sweep() -> None:
        while not done.wait(2.0):
            try:
                if time.time() - lock.stat().st_mtime > 15:
                    lock.unlink()
            except OSError:
                pass

    sweeper = threading.Thread(target=sweep, daemon=True)
    sweeper.start()
    yield
    done.set()


@pytest.fixture(scope="session")
@needs("root")
def sshd() -> SSHServer:
    # Not under pytest's 0700 tmp root: plain test users must read authorized_keys.
    workdir = Path(tempfile.mkdtemp(prefix="orch-sshd-"))
    server = start_sshd(workdir)
    yield server
    server.stop()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's tiny GPT-2, tokenizer and data, built offline once per session."""
    sys.path.insert(0, str(REPO / "tools"))
    from make_tiny_assets import make_tiny_assets

    dest = tmp_path_factory.mktemp("tiny-assets") / "assets"
    make_tiny_assets(dest)
    return dest


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orch]:
    """Connection holders a test's commands start are stopped after it (and idle out soon)."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(ORCH_HOME=str(home), PYTHONPATH=str(REPO), ORCH_CONNECT_ATTEMPTS="2",
               ORCH_CONNECT_TIMEOUT_S="5", HF_HUB_OFFLINE="1", ORCH_HOLD_IDLE_S=HOLD_IDLE_S,
               ORCH_WARM_IDLE_S=HOLD_IDLE_S)
    work = tmp_path / "laptop"
    work.mkdir()
    yield Orch(home, tmp_path / "remote", env, work)
    if home.is_dir():
        stop_holders(home)


@pytest.fixture
def box(orch: Orch, sshd: SSHServer) -> str:
    """An inventory host ``box``: root@127.0.0.1 on the test sshd, key pinned with --trust."""
    orch("hosts", "add", "box", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root), "--python", sys.executable, "--trust")
    return "box"


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.root)])
def host(request: pytest.FixtureRequest, orch: Orch) -> str:
    """Each test runs against the built-in `local` host and against the loopback sshd."""
    if request.param == "local":
        return "local"
    return request.getfixturevalue("box")


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.root)])
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Remote]:
    """A connection to a host whose root is ``tmp_path/remote``: `local` and the loopback sshd."""
    root = tmp_path / "remote"
    if request.param == "local":
        host = Host(name="local", kind="local", root=str(root))
    else:
        sshd: SSHServer = request.getfixturevalue("sshd")
        host = Host(name="box", address="127.0.0.1", port=sshd.port, user="root", identity_file=str(sshd.client_key),
                    root=str(root), python=sys.executable, host_key=sshd.host_key_line)
    with open_transport(host, None, lambda fp: False) as transport:
        yield Remote(host, transport)



"""Shared fixtures: a real sshd on loopback, an isolated ORCH_HOME, and an ``orch`` runner
that runs the real CLI in a subprocess (real exit codes, real stderr)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator
from unittest.mock import patch

import pytest

from orchestrator.access.connect import open_transport
from orchestrator.helper.remote import Remote
from orchestrator.hosts.inventory import Host
from orchestrator.sync import record as synccache
from orchestrator.sync import selection as syncmod
from tests.support.sshd import SSHServer, start_sshd

REPO = Path(__file__).resolve().parent.parent
HOLD_IDLE_S = "20"  # connection holders (docs/connections.md) of the tests idle out soon


def stop_holders(home: Path) -> None:
    from orchestrator.holder.spawn import stop_holders as stop

    stop(home, wait_s=5)


@pytest.fixture(scope="session", autouse=True)
def laptop_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """ORCH_HOME for code the tests run in-process: never the real user's."""
    home = tmp_path_factory.mktemp("orch-home")
    with patch.dict(os.environ, {"ORCH_HOME": str(home), "ORCH_HOLD_IDLE_S": HOLD_IDLE_S}):
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


@dataclass
class Orch:
    """Runs ``orch`` with its own ORCH_HOME; ``remote_root`` is where hosts keep files."""

    home: Path
    remote_root: Path
    env: dict[str, str]
    cwd: Path

    def __call__(self, *args: str, timeout: float = 180, check: int | None = 0,
                 env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "orchestrator", *args], cwd=self.cwd, env={**self.env, **(env or {})},
            capture_output=True, text=True, timeout=timeout,
        )
        if check is not None and proc.returncode != check:
            raise AssertionError(f"orch {' '.join(args)} exited {proc.returncode}, wanted {check}\n"
                                 f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
        return proc

    def json(self, *args: str, **kw: Any) -> Any:
        return json.loads(self(*args, "--json", **kw).stdout)

    def wait_state(self, job_id: str, states: tuple[str, ...], timeout: float = 120) -> dict[str, Any]:
        deadline = time.time() + timeout
        while True:
            status = self.json("status", job_id)
            if status["state"] in states or time.time() > deadline:
                return status
            time.sleep(0.3)

    def job_dir(self, job_id: str) -> Path:
        return Path(self.json("status", job_id)["job_dir"])

    def server_workspace(self, ws: Path, root: Path | None = None) -> Path:
        """Where this laptop's checkout ``ws`` lives on a host whose root is ``root``."""
        with patch.dict(os.environ, {"ORCH_HOME": str(self.home)}):
            return (root or self.remote_root) / "workspace" / syncmod.project_name(ws)


@pytest.fixture
def orch(tmp_path: Path) -> Iterator[Orch]:
    """Connection holders a test's commands start are stopped after it (and idle out soon)."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(ORCH_HOME=str(home), PYTHONPATH=str(REPO), ORCH_CONNECT_ATTEMPTS="2",
               ORCH_CONNECT_TIMEOUT="5", HF_HUB_OFFLINE="1", ORCH_HOLD_IDLE_S=HOLD_IDLE_S)
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


@pytest.fixture(params=["local", "ssh"])
def host(request: pytest.FixtureRequest, orch: Orch) -> str:
    """Each test runs against the built-in `local` host and against the loopback sshd."""
    if request.param == "local":
        return "local"
    return request.getfixturevalue("box")


def exact_workspace(cwd: Path, assets: Path) -> Path:
    """``cwd/ws`` holding the tiny assets (once) with the model's dropout off, so runs can be
    compared bit for bit: the workspace of the trainer jobs the end-to-end tests submit."""
    ws = cwd / "ws"
    if not ws.exists():
        shutil.copytree(assets, ws / "assets")
        config = ws / "assets" / "tiny-gpt2" / "config.json"
        cfg = json.loads(config.read_text())
        cfg.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        config.write_text(json.dumps(cfg))
    return ws


def dead_port() -> int:
    """A loopback port nothing listens on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_job(dir: Path, name: str, host: str, command: list[str], extra: str = "") -> Path:
    """A job file for ``command`` with a workspace holding one script."""
    ws = dir / "ws"
    ws.mkdir(exist_ok=True)
    spec = dir / f"{name}.yaml"
    spec.write_text(
        f"name: {name}\nhosts: [{host}]\nworkspace: {{path: ws}}\n"
        f"launch:\n  nproc_per_node: 1\n  command: {json.dumps(command)}\n{extra}"
    )
    return spec


@pytest.fixture(params=["local", "ssh"])
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


def run_sync(remote: Remote, ws: Path, exclude: list[str] | None = None, force: bool = False):
    state = synccache.hello(remote, syncmod.project_name(ws))["sync"]
    return syncmod.sync(remote, ws, exclude or [], state, force)


def tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


# A job that ticks (argv[1] ticks, default 100000), records each attempt in outputs/, and on
# SIGTERM leaves checkpoint-<attempt> as a trainer would: cancel/resume tests.
TICKER = """\
import os, pathlib, signal, sys, time
out = pathlib.Path(os.environ["ORCH_JOB_DIR"]) / "outputs"
out.mkdir(exist_ok=True)
attempt = len(list(out.glob("attempt-*"))) + 1
(out / f"attempt-{attempt}-{os.getpid()}").touch()
def stop(*_):
    (out / f"checkpoint-{attempt}").touch()  # what a trainer does on SIGTERM
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 100000):
    print("tick", attempt, i, flush=True)
    time.sleep(0.2)
"""


@contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A small tmpfs at ``mount`` (a disk that fills up), unmounted afterwards."""
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


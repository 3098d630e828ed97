"""The orch CLI as the tests run it (``Orch``: the real command in a subprocess, its own
ORCH_HOME), and the workspaces, jobs and small machine helpers the tests share."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator
from unittest.mock import patch

from orchestrator.helper.remote import Remote
from orchestrator.holder.spawn import stop_holders as _stop_holders
from orchestrator.sync import record as synccache
from orchestrator.sync import selection
from orchestrator.sync.send import sync
from orchestrator.warm.server import stop_servers
from tests.support.tiers import need

REPO = Path(__file__).resolve().parents[2]
HOLD_IDLE_S = "20"  # connection holders (docs/connections.md) and warm servers of the tests idle out soon


def stop_holders(home: Path) -> None:
    """The connection holders and the warm servers of ``home``, stopped."""
    _stop_holders(home, wait_s=5)
    stop_servers(home)


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
            return (root or self.remote_root) / "workspace" / selection.project_name(ws)


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
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def submit_paused(orch: Orch, spec: Path, point: str, hooks: Path, *args: str) -> subprocess.Popen[str]:
    """``orch submit SPEC --json ARGS`` in the background, held at pause point ``point``
    (orchestrator/testhooks.py) until ``release``."""
    hooks.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "submit", str(spec), "--json", *args],
                            cwd=orch.cwd, env={**orch.env, "ORCH_TEST_PAUSE": f"{point}:{hooks}"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 90
    while not (hooks / f"{point}.reached").exists():
        assert proc.poll() is None, f"submit ended before {point}: {proc.communicate()}"
        assert time.time() < deadline, f"submit never reached {point}"
        time.sleep(0.05)
    return proc


def release(proc: subprocess.Popen[str], point: str, hooks: Path, timeout: float = 180) -> tuple[int, str, str]:
    """Let a ``submit_paused`` submit go on; its exit code, stdout and stderr."""
    (hooks / f"{point}.go").touch()
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


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


def run_sync(remote: Remote, ws: Path, exclude: list[str] | None = None, force: bool = False):
    state = synccache.hello(remote, selection.project_name(ws))["sync"]
    return sync(remote, ws, exclude or [], state, force)


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
    """A small tmpfs at ``mount`` (a disk that fills up), unmounted afterwards (test tier ``root``)."""
    need("root", "tmpfs (mount -t tmpfs)")
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)

"""Nothing left billing by orch's own failure (issue 37 item 5), through the CLI against the AutoDL
stand-in: a submit that powered an instance on and then failed before its job started powers it
back off and says so; one that started its job, or a sweep with a combination started there,
leaves it on; Ctrl-C during `submit --follow --watch` of a running job leaves it on (the job runs
on), whatever `on_finish.power_off` says."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from remote_payload.contract.protocol import TERMINAL
from tests.e2e.provider.test_autodl import TOKEN_ENV, add, admin, inside_shutdown
from tests.orchestrator.warm.test_warm import read_until
from tests.support.orch import Orch, dead_port, submit_paused
from tests.support.poll import wait_until
from tests.support.standin.autodl import AutoDLStandin

BACK_OFF = "{host}: powered back off — orch powered it on for this submit, which failed: "


@pytest.fixture
def token(orch: Orch, autodl: AutoDLStandin) -> str:
    orch.env[TOKEN_ENV] = autodl.token
    return autodl.token


def job_file(orch: Orch, hosts: str, code: str, extra: str = "") -> Path:
    """``job.yaml`` running ``python3 run.py`` (``code``) on ``hosts``."""
    ws = orch.cwd / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "run.py").write_text(code)
    spec = orch.cwd / "job.yaml"
    spec.write_text(f"name: pw\nhosts: [{hosts}]\nworkspace: {{path: ws}}\n"
                    f"launch: {{nproc_per_node: 1, command: python3 run.py}}\n{extra}")
    return spec


def off_with_its_key_pinned(orch: Orch, autodl: AutoDLStandin, name: str, index: int) -> str:
    """Host ``name`` on instance ``index``, its host key pinned, powered off; its uuid."""
    uuid = add(orch, autodl, name, index)
    orch("up", name, "--trust")
    orch("down", name)
    return uuid


def test_a_submit_that_fails_after_powering_on_powers_the_box_back_off_and_one_that_starts_leaves_it_on(
        orch: Orch, autodl: AutoDLStandin, token: str, tmp_path: Path) -> None:
    uuid = off_with_its_key_pinned(orch, autodl, "p1", 0)
    box = autodl.boxes[uuid]
    spec = job_file(orch, "p1", "print('ran')\n")

    # Ctrl-C once the job is reserved, before its code is sent: nothing started, the box goes back off
    proc = submit_paused(orch, spec, "before-sync", tmp_path / "hooks", "--yes")
    assert box.status == "running" and uuid in autodl.billing()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 130, err
    assert BACK_OFF.format(host="p1") + "interrupted (Ctrl-C)" in err and "Traceback" not in err
    assert box.status == "shutdown" and uuid not in autodl.billing()

    # a submit that starts its job leaves the box on
    ok = orch("submit", "job.yaml", "--yes")
    job = ok.stdout.strip()
    assert "powering on autodl instance" in ok.stderr and "powered back off" not in ok.stderr
    assert box.status == "running" and uuid in autodl.billing()
    assert orch.wait_state(job, TERMINAL)["state"] == "succeeded"
    orch("down", "p1")

    # the box comes back with another host key: refused after the power-on, the error as it was
    admin(autodl, "move", instance_uuid=uuid)
    moved = orch("submit", "job.yaml", "--yes", check=3)
    assert "DIFFERENT host key" in moved.stderr and "orch hosts trust p1 --replace" in moved.stderr
    assert BACK_OFF.format(host="p1") in moved.stderr
    assert box.status == "shutdown" and uuid not in autodl.billing()
    orch("up", "p1", check=3)  # still the other key: `orch up` refuses it too (and leaves the box on)
    orch("hosts", "trust", "p1", "--replace")
    orch("down", "p1")

    # the Python API does the same: its error raised as it is, the box back off, said through say
    admin(autodl, "move", instance_uuid=uuid)
    code = ("from orchestrator.api import Orch\ntry:\n    Orch(say=print).submit('job.yaml', yes=True)\n"
            "except Exception as exc:\n    print('raised', type(exc).__name__)\n")
    api = subprocess.run([sys.executable, "-c", code], cwd=orch.cwd, env=orch.env, capture_output=True, text=True,
                         timeout=300)
    assert "raised HostKeyError" in api.stdout and BACK_OFF.format(host="p1") in api.stdout, api.stdout + api.stderr
    assert box.status == "shutdown" and uuid not in autodl.billing()


def test_a_sweep_keeps_the_box_on_where_a_combination_started_and_powers_it_back_off_where_none_did(
        orch: Orch, autodl: AutoDLStandin, token: str) -> None:
    uuid = off_with_its_key_pinned(orch, autodl, "p3", 0)
    box = autodl.boxes[uuid]
    orch("hosts", "add", "gone", "--ssh", f"ssh -p {dead_port()} root@127.0.0.1", "--python", "/usr/bin/python3")
    job_file(orch, "p3, gone", "import os\nprint('ran', os.environ['X'])\n",
             "env: {X: '0'}\nsweep:\n  env.X: [a, b]\n")

    # combination 1 on p3 starts, combination 2 on the dead host does not: p3 stays on
    half = orch("submit", "job.yaml", "--yes", "--sweep-name", "half", check=3)
    assert "1 of 2 combination(s) not started" in half.stderr and "powered back off" not in half.stderr
    assert box.status == "running" and uuid in autodl.billing()
    started = half.stdout.split()[0]
    assert orch.wait_state(started, TERMINAL)["state"] == "succeeded"
    orch("down", "p3")

    # every combination on the dead host (--hosts): p3, the job file's host, was powered on for nothing
    none = orch("submit", "job.yaml", "--yes", "--sweep-name", "none", "--hosts", "gone", check=3)
    assert "p3: powering on autodl instance" in none.stderr
    assert BACK_OFF.format(host="p3") + "sweep none: 2 of 2 combination(s) not started:" in none.stderr
    assert box.status == "shutdown" and uuid not in autodl.billing()

    # every combination on another host that runs them: the sweep succeeds, and p3 goes back off all the same
    elsewhere = orch("submit", "job.yaml", "--yes", "--sweep-name", "elsewhere", "--hosts", "local")
    assert len(elsewhere.stdout.splitlines()) == 2 and "local" in elsewhere.stdout
    assert "p3: powered back off — orch powered it on for this submit, which started no job there" in elsewhere.stderr
    assert box.status == "shutdown" and uuid not in autodl.billing()


def test_on_a_terminal_it_asks_before_powering_back_off_and_a_no_leaves_the_box_on_with_the_way_to_power_it_off(
        orch: Orch, autodl: AutoDLStandin, token: str) -> None:
    uuid = off_with_its_key_pinned(orch, autodl, "p4", 0)
    box = autodl.boxes[uuid]
    job_file(orch, "p4", "print('ran')\n")
    admin(autodl, "move", instance_uuid=uuid)
    pid, fd = pty.fork()
    if pid == 0:  # orch in a terminal of its own
        os.chdir(orch.cwd)
        os.execve(sys.executable, [sys.executable, "-m", "orchestrator", "submit", "job.yaml"], orch.env)
    said = b""
    try:
        said = read_until(fd, b"Power it on (billing starts)? [y/N]: ")
        os.write(fd, b"y\n")
        said += read_until(fd, b"Power p4 back off (billing stops)? [Y/n]: ")
        assert box.status == "running"
        os.write(fd, b"n\n")
        said += read_until(fd, b"orch down p4 powers it off")
        said += rest_of(fd)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 3, said
    assert b"DIFFERENT host" in said and b"p4: left on (billing)" in said and b"powered back off" not in said
    assert box.status == "running" and uuid in autodl.billing()
    orch("hosts", "trust", "p4", "--replace")
    orch("down", "p4")


def rest_of(fd: int) -> bytes:
    """What the terminal ``fd`` shows until the process in it ends."""
    got = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the other end closed
            return got
        if not chunk:
            return got
        got += chunk


def test_ctrl_c_during_submit_follow_watch_leaves_the_job_running_and_its_box_on(
        orch: Orch, autodl: AutoDLStandin, token: str) -> None:
    uuid = add(orch, autodl, "p2", 1)
    box = autodl.boxes[uuid]
    orch("up", "p2", "--trust")
    job_file(orch, "p2", "import time\nprint('tick', flush=True)\ntime.sleep(600)\n",
             f"on_finish: {{power_off: true, shutdown_command: {inside_shutdown(autodl, uuid)}}}\n")
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "submit", "job.yaml", "--follow", "--watch",
                             "--watch-interval", "0.5"], cwd=orch.cwd, env=orch.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    wait_until(lambda: "tick\n" in lines or proc.poll() is not None, what="the followed log's first line",
               timeout=120, interval=0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "on_finish.power_off" not in err and "Traceback" not in err
    assert box.status == "running" and uuid in autodl.billing()
    job = orch.json("ls")[0]["job_id"]
    assert orch.json("status", job)["state"] == "running"  # the job runs on, and so does its box
    orch("cancel", job)
    orch("down", "p2")

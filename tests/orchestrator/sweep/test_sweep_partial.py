"""A sweep past a dead host (issue 23, class 7): the combinations on hosts that answer go
ahead, the others are named with the one command that submits exactly those, no reservation
is left that status counts forever, and the same command again starts only what is missing.

Two hosts on the loopback sshd, each a root of its own: ``box`` direct, ``box2`` through a
FaultProxy the test points at a dead port (dead from the start) or cuts mid-launch."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from remote_payload.contract.protocol import TERMINAL
from tests.support.orch import Orch, dead_port
from tests.support.proxy import FaultProxy
from tests.support.sshd import SSHServer

JOB = """\
name: tiny
hosts: [{hosts}]
workspace: {{path: ws}}
launch:
  nproc_per_node: 1
  command: [python, -c, "import os; print('ran', os.environ['X'])"]
env: {{X: "0"}}
sweep:
  env.X: [a, b, c, d]
"""
QUIET = {"ORCH_HOLD": "0"}  # the submit's own connections only: a cut is exactly where the test puts it


@pytest.fixture
def proxy(sshd: SSHServer) -> Iterator[FaultProxy]:
    p = FaultProxy(sshd.port)
    yield p
    p.close()


@pytest.fixture
def pool(orch: Orch, box: str, sshd: SSHServer, proxy: FaultProxy) -> Orch:
    """``box`` and ``box2`` (through ``proxy``, its own root) and a workspace."""
    orch("hosts", "add", "box2", "--ssh", f"ssh -p {proxy.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root / "box2"), "--python", sys.executable, "--trust")
    (orch.cwd / "ws").mkdir()
    (orch.cwd / "ws" / "keep.txt").write_text("x\n")
    return orch


def write(orch: Orch, hosts: str) -> None:
    (orch.cwd / "job.yaml").write_text(JOB.format(hosts=hosts))


def the_command(stderr: str) -> list[str]:
    """The command the report ends with, as argv after ``orch``."""
    line = stderr.rstrip().splitlines()[-1].strip()
    argv = shlex.split(line)
    assert argv[:2] == ["orch", "submit"], stderr
    return argv[1:]


def paused_submit(orch: Orch, hooks: Path, point: str, *args: str) -> subprocess.Popen[str]:
    """``orch submit job.yaml ARGS`` in the background, held at pause point ``point``
    (orchestrator/testhooks.py) until the test touches ``hooks/<point>.go``."""
    hooks.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "submit", "job.yaml", *args], cwd=orch.cwd,
                            env={**orch.env, **QUIET, "ORCH_TEST_PAUSE": f"{point}:{hooks}"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    began = time.time()
    while not (hooks / f"{point}.reached").exists():
        assert time.time() - began < 120 and proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    return proc


def jobs_on(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "jobs").glob("tiny-*"))


def sweep_summary(orch: Orch, name: str) -> str:
    return orch("status", "--sweep", name, env={"COLUMNS": "100", **QUIET}).stdout.splitlines()[-1]


def test_a_host_dead_from_the_start_leaves_its_combinations_out_with_the_command_for_them(
        pool: Orch, proxy: FaultProxy) -> None:
    orch = pool
    write(orch, "box, box2")
    proxy.target = dead_port()  # box2's address answers nothing
    out = orch("submit", "job.yaml", "--sweep-name", "s1", check=3, env=QUIET)
    started = [line.split() for line in out.stdout.splitlines()]
    assert [(s[1], s[2]) for s in started] == [("box", "X=a"), ("box", "X=c")]  # box's combinations went ahead
    assert "Traceback" not in out.stderr
    assert "error: sweep s1: 2 of 4 combination(s) not started:" in out.stderr
    assert "  #2 (X=b), #4 (X=d): cannot reach box2 (" in out.stderr
    assert all(len(line) <= 80 for line in out.stderr.splitlines()[-5:-1])
    command = the_command(out.stderr)
    assert command == ["submit", "job.yaml", "--sweep-name", "s1", "--only", "2,4", "--hosts", "box"]
    for job_id, *_ in started:
        assert orch.wait_state(job_id, TERMINAL)["state"] == "succeeded"
    assert len(orch.json("ls")) == 2  # no reservation for what never started
    assert sweep_summary(orch, "s1") == "4 combinations: 2 succeeded, 2 not started"

    moved = orch.json(*command, env=QUIET)  # exactly those, on the host that answers
    assert [(j["combination"], j["host"], j["skipped"]) for j in moved] == [(2, "box", False), (4, "box", False)]
    for job in moved:
        assert orch.wait_state(job["job_id"], TERMINAL)["state"] == "succeeded"
    again = orch("submit", "job.yaml", "--sweep-name", "s1", env=QUIET)  # idempotent: nothing left to start
    assert again.stderr.count("started by an earlier submit of sweep s1: skipped") == 4
    assert len(orch.json("ls")) == 4 and len(jobs_on(orch.remote_root)) == 4
    assert sweep_summary(orch, "s1") == "4 combinations: 4 succeeded"


def test_a_launch_cut_off_on_one_host_never_stops_the_other_and_its_reservation_is_settled(
        pool: Orch, proxy: FaultProxy, tmp_path: Path) -> None:
    orch = pool
    write(orch, "box2, box")  # box2 first: the first launch (combination 1) is the one cut
    hooks = tmp_path / "hooks"
    proc = paused_submit(orch, hooks, "launch-half-sent", "--sweep-name", "s2", "--json")
    proxy.cut()  # half a launch request reached box2: it starts nothing
    (hooks / "launch-half-sent.go").touch()
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 3, stderr
    assert "Traceback" not in stderr
    rows = {r["combination"]: r for r in json.loads(stdout)}
    assert [rows[n]["state"] for n in (1, 2, 3, 4)] == ["not-started", "pending", "not-started", "pending"]
    assert "may have started there" in rows[1]["reason"] and rows[1]["job_id"]
    assert "  #1 (X=a): " in stderr and "  #3 (X=c): " in stderr and "box2" in stderr
    command = the_command(stderr)
    assert command == ["submit", "job.yaml", "--sweep-name", "s2", "--only", "1,3", "--hosts", "box"]
    assert jobs_on(orch.remote_root / "box2") == []

    moved = orch.json(*command, env=QUIET)  # box2 answers again: its reservation is asked about and removed
    assert [(j["combination"], j["host"]) for j in moved] == [(1, "box"), (3, "box")]
    for job in [*moved, rows[2], rows[4]]:
        assert orch.wait_state(job["job_id"], TERMINAL)["state"] == "succeeded"
    listed = orch.json("ls")
    assert len(listed) == 4 and rows[1]["job_id"] not in [j["job_id"] for j in listed]  # the stale one is gone
    assert sweep_summary(orch, "s2") == "4 combinations: 4 succeeded"
    assert len(jobs_on(orch.remote_root)) == 4


def test_ctrl_c_after_the_sync_leaves_no_reservation_and_names_the_command_that_submits_them(
        pool: Orch, tmp_path: Path) -> None:
    orch = pool
    write(orch, "box, box2")
    proc = paused_submit(orch, tmp_path / "hooks", "after-sync", "--sweep-name", "s3", "--only", "1-3")
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and stdout == ""
    assert "sweep s3: 3 of 3 combination(s) not started:" in stderr and "  #1 (X=a), #2 (X=b), #3 (X=c): interrupted" in stderr
    command = the_command(stderr)
    assert command == ["submit", "job.yaml", "--sweep-name", "s3", "--only", "1,2,3"]
    assert orch.json("ls") == []  # nothing reserved, nothing to settle
    done = orch.json(*command, env=QUIET)
    assert [(j["combination"], j["host"]) for j in done] == [(1, "box"), (2, "box2"), (3, "box")]
    for job in done:
        assert orch.wait_state(job["job_id"], TERMINAL)["state"] == "succeeded"
    assert sweep_summary(orch, "s3") == "4 combinations: 3 succeeded, 1 not started"

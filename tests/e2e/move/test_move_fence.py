"""One live attempt across hosts (issue 23, classes 1 and 12).

A move away from a host that does not answer waits until the host is lost for
ORCH_LOST_AFTER_S (or --force, warned with its risk); once the job has moved, its attempt on
the old host is superseded: the first contact with that host stops it and sets its folder
aside (said on stderr), and status, logs, cancel, a move back and a second move follow the
job where it lives now. The laptop's copy is found from any directory. The old host is the
loopback sshd behind a FaultProxy pointed at a dead port (cut off, the job still running on
it) and back."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.moves import superseded
from tests.support.orch import TICKER, Orch, dead_port, write_job
from tests.support.poll import wait_until
from tests.support.proxy import FaultProxy
from tests.support.sshd import SSHServer

QUIET = {"ORCH_HOLD": "0"}  # no connection holder keeps a link open through the proxy


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except OSError:
        return False


def ticking_with_a_kit(orch: Orch, host: str, watch_from: Path, env: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """A ticker job running on ``host``, and the laptop's copy of it kept by a watch run from
    ``watch_from``: (job id, the job's status.json on the server, with its processes)."""
    (orch.cwd / "ws").mkdir(exist_ok=True)
    (orch.cwd / "ws" / "tick.py").write_text(TICKER)
    job = orch.json("submit", str(write_job(orch.cwd, "tick", host, ["python", "tick.py"])), env=env)["job_id"]
    assert orch.wait_state(job, ("running",))["state"] == "running"
    watch_from.mkdir(exist_ok=True)
    watch = subprocess.Popen([sys.executable, "-m", "orchestrator", "fetch", job, "--watch", "--interval", "0.5"],
                             cwd=watch_from, env={**orch.env, **env}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: (watch_from / "runs" / job / ".orch-job" / "move.json").is_file(),
                   what="the laptop's copy", timeout=120)
    finally:
        watch.terminate()
        watch.wait(timeout=60)
    server = json.loads((orch.remote_root / "jobs" / job / "status.json").read_text())
    assert alive(server["supervisor_pid"])
    return job, server


def test_a_move_from_a_silent_host_waits_until_it_is_lost_and_the_old_attempt_is_stopped_at_first_contact(
        orch: Orch, sshd: SSHServer, flaky: str, proxy: FaultProxy, box2: str) -> None:
    env = dict(QUIET, ORCH_LOST_AFTER_S="4")
    elsewhere = orch.cwd / "elsewhere"
    job, old = ticking_with_a_kit(orch, flaky, elsewhere, env)

    proxy.target = dead_port()  # the host drops off the network; the job still runs there
    proxy.cut()
    early = orch("resume", job, "--on", box2, check=3, env=env)
    assert f"{job} may still run there" in early.stderr and "run this again in 4 s" in early.stderr
    assert "--force moves it now, at a risk" in early.stderr and "runs on both hosts" in early.stderr
    assert "Traceback" not in early.stderr
    assert orch.json("status", job, env=env)["hosts"] == [flaky]  # nothing moved

    time.sleep(4.5)  # the host has now failed for ORCH_LOST_AFTER_S: lost, and the move goes ahead
    moved = orch("resume", job, "--on", box2, env=env)  # run from orch.cwd: the copy is in elsewhere/runs
    assert f"moving from {elsewhere / 'runs' / job}" in moved.stderr
    assert f"{job}'s attempt on {flaky} is superseded, but {flaky} does not answer" in moved.stderr
    assert alive(old["supervisor_pid"])  # still running on the silent host: nothing could reach it

    status = orch("status", job, "--json", env=env)
    shown = json.loads(status.stdout)
    assert shown["hosts"] == [box2] and shown["superseded_running_on"] == [flaky]
    assert f"its attempt on {flaky} may still run" in status.stderr

    proxy.target = sshd.port  # it answers again: the first contact stops the old attempt
    back = orch("status", env=env)
    assert f"{job}: stopped its superseded attempt on {flaky} (it was running" in back.stderr, back.stderr
    wait_until(lambda: not alive(old["supervisor_pid"]) and not any(alive(int(p[0])) for p in old["procs"]),
               what="the old attempt's processes to end", timeout=60)
    aside = superseded(orch.remote_root / "jobs", job)
    assert json.loads((aside / "superseded.json").read_text())["moved_to"] == box2
    assert not (orch.remote_root / "jobs" / job).exists()  # never read as the job's again
    again = orch("status", job, "--json", env=env)
    assert "superseded_running_on" not in json.loads(again.stdout) and "superseded" not in again.stderr
    assert f"left on {flaky}: stopped its superseded attempt on {flaky}" in orch("show", job, env=env).stdout

    orch.wait_state(job, ("running",))
    wait_until(lambda: "tick 2 " in orch("logs", job, env=env).stdout,
               what="the log of the attempt on box2", timeout=60)
    def last_tick_1(text: str) -> int:
        return max(int(line.split()[2]) for line in text.splitlines() if line.startswith("tick 1 "))

    # the log is the job's, from where it lives: attempt 1 as far as the copy it moved from, not
    # what the superseded attempt printed after it (kept in its folder set aside)
    copied = (elsewhere / "runs" / job / ".orch-job" / "logs" / "node0.log").read_text()
    assert last_tick_1(orch("logs", job, env=env).stdout) == last_tick_1(copied)
    assert last_tick_1((aside / "logs" / "node0.log").read_text()) > last_tick_1(copied)
    assert orch("cancel", job, env=env).stdout.strip() == f"{job}: cancelled"

    home = orch("resume", job, "--on", flaky, env=env)  # back to the first host: a fresh folder there
    assert f"{job}: its earlier folder on {box2} (cancelled) is set aside as" in home.stderr
    final = orch.wait_state(job, ("running",))
    new_dir = orch.remote_root / "jobs" / job
    assert final["hosts"] == [flaky] and Path(final["job_dir"]) == new_dir
    assert [m["to"] for m in json.loads((new_dir / "moves.json").read_text())] == [box2, flaky]
    assert superseded(orch.remote_root / "box2" / "jobs", job).is_dir()
    wait_until(lambda: "tick 3 " in orch("logs", job, env=env).stdout, what="the third attempt's log", timeout=60)
    orch("cancel", job, env=env)


def test_force_moves_at_once_naming_the_risk_and_cancel_stops_the_attempt_left_behind(
        orch: Orch, sshd: SSHServer, flaky: str, proxy: FaultProxy) -> None:
    far_proxy = FaultProxy(sshd.port)
    try:
        orch("hosts", "add", "far", "--ssh", f"ssh -p {far_proxy.port} root@127.0.0.1", "--identity",
             str(sshd.client_key), "--root", str(orch.remote_root / "far"), "--python", sys.executable, "--trust")
        job, old = ticking_with_a_kit(orch, flaky, orch.cwd, QUIET)
        proxy.target = dead_port()
        proxy.cut()

        refused = orch("resume", job, "--on", "far", check=3, env=QUIET)  # ORCH_LOST_AFTER_S: 10 min by default
        assert "waits until it has failed for 10 min" in refused.stderr and "run this again in " in refused.stderr
        forced = orch("resume", job, "--on", "far", "--force", env=QUIET)
        assert f"warning: --force: moving {job} away from {flaky}" in forced.stderr
        assert "runs on both hosts until orch reaches" in forced.stderr
        assert orch.wait_state(job, ("running",))["hosts"] == ["far"]
        assert alive(old["supervisor_pid"])  # the risk --force named: two live attempts, for now

        logs = orch("logs", job, env=QUIET)
        assert f"its attempt on {flaky} may still run" in logs.stderr

        proxy.target = sshd.port
        cancelled = orch("cancel", job, env=QUIET)  # its first contact with the old host
        assert cancelled.stdout.strip() == f"{job}: cancelled"
        assert f"{job}: stopped its superseded attempt on {flaky}" in cancelled.stderr
        wait_until(lambda: not alive(old["supervisor_pid"]), what="the old supervisor to end", timeout=60)
        assert superseded(orch.remote_root / "jobs", job).is_dir()

        far_proxy.target = dead_port()  # now the new host is gone too
        far_proxy.cut()
        stale = orch("resume", job, "--on", flaky, "--force", check=2, env=QUIET)
        assert f"was made on {flaky}, before {job} moved to far" in stale.stderr  # never the job's again
        nowhere = orch("resume", job, "--on", flaky, "--force", "--from", "nowhere", check=3, env=QUIET)
        assert f"looked in {orch.cwd / 'nowhere' / job / '.orch-job'} (--from)" in nowhere.stderr
        (orch.cwd / "runs" / job / ".orch-job" / "move.json").unlink()
        none = orch("resume", job, "--on", flaky, "--force", check=3, env=QUIET)
        assert f"{orch.cwd / 'runs' / job / '.orch-job'} (where orch fetch --watch kept it)" in none.stderr
        assert "Traceback" not in stale.stderr + nowhere.stderr + none.stderr
        assert orch.json("status", job, env=QUIET)["hosts"] == ["far"]
    finally:
        far_proxy.close()

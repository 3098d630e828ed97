"""A job whose server disappears (issue 14, point 4): `orch status` shows it `lost` with how
long the host has been unreachable and the way out (`orch resume JOB --on OTHER_HOST`) once
the host has failed for ORCH_LOST_AFTER_S — not before — and its real state again when the
host answers. The host is the loopback sshd behind a FaultProxy whose target the test points
at a dead port (the "deleted instance") and back."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from rich.cells import cell_len

from orchestrator.state import reach
from tests.e2e.faults.conftest import proxy  # noqa: F401 - the fixture
from tests.support.orch import TICKER, Orch, dead_port, write_job
from tests.support.proxy import FaultProxy
from tests.support.sshd import SSHServer

LOST_AFTER_S = 2.0


def test_a_host_gone_for_long_shows_its_jobs_lost_with_the_way_out_then_their_real_state(
        orch: Orch, sshd: SSHServer, proxy: FaultProxy) -> None:
    orch("hosts", "add", "gone", "--ssh", f"ssh -p {proxy.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root), "--python", sys.executable, "--trust")
    env = {"ORCH_LOST_AFTER_S": str(LOST_AFTER_S), "ORCH_HOLD": "0", "COLUMNS": "80"}
    done = write_job(orch.cwd, "done", "gone", ["python", "-c", "print('ok')"])
    finished = orch.json("submit", str(done), "--follow", env=env)["job_id"]
    spec = write_job(orch.cwd, "tick", "gone", ["python", "tick.py"])
    (orch.cwd / "ws" / "tick.py").write_text(TICKER)
    job = orch.json("submit", str(spec), env=env)["job_id"]
    assert orch.wait_state(job, ("running",))["state"] == "running"

    proxy.target = dead_port()  # the instance is deleted: nothing answers at its address
    proxy.cut()
    began = time.time()
    first = orch.json("status", job, env=env)
    assert first["state"] == "running" and first.get("stale") and "lost" not in str(first.get("reason"))

    deadline = time.time() + 60
    while (status := orch.json("status", job, env=env))["state"] != "lost":
        assert time.time() < deadline, status
        time.sleep(0.2)
    assert time.time() - began >= LOST_AFTER_S  # never before the host failed for that long
    reason = status["reason"]
    assert reason.startswith("host gone unreachable for ") and "(since " in reason
    assert f"if the instance is gone: orch resume {job} --on OTHER_HOST" in reason
    assert status["unreachable_since"] >= began - 1 and status["last_contact"] < began

    table = orch("status", env=env)
    rows = table.stdout.splitlines()
    assert all(cell_len(line) <= 80 for line in rows), table.stdout
    state = {next(j for j in (job, finished) if j.startswith(line.split()[0])): line.split()[1] for line in rows[1:]}
    assert state == {job: "lost", finished: "succeeded"}, table.stdout  # a finished job keeps its record
    assert "host gone unreachable for" in table.stderr and "orch resume JOB --on OTHER_HOST" in table.stderr
    assert "Traceback" not in table.stderr
    watched = orch("status", "-w", "--iterations", "1", "--wide", env=env)
    assert f"orch resume {job} --on OTHER_HOST" in watched.stdout
    everything = {s["job_id"]: s for s in orch.json("status", env=env)}
    assert everything[job]["state"] == "lost" and everything[finished]["state"] == "succeeded"

    proxy.target = sshd.port  # it answers again: the real state, and the outage forgotten
    back = orch.json("status", job, env=env)
    assert back["state"] == "running" and not back.get("stale") and "unreachable" not in str(back.get("reason"))
    seen = reach.get(orch.home / "registry.db", "gone")
    assert seen.failing_since is None and seen.last_ok is not None and seen.last_ok >= began
    orch("cancel", job, "--grace", "2", env=env)


def test_reach_records_failures_and_successes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record itself: the first failure is kept through later ones, a success clears it,
    and lost means failures spanning ORCH_LOST_AFTER_S (contacts, not the clock)."""
    from orchestrator.state.registry import Registry

    db = Registry(tmp_path).path
    monkeypatch.setenv("ORCH_LOST_AFTER_S", "600")
    assert reach.get(db, "box") == reach.Reach("box")
    reach.record(db, "box", ok=True, now=1000.0)
    first = reach.record(db, "box", ok=False, error="refused", now=2000.0)
    assert (first.failing_since, first.last_failure, first.last_ok) == (2000.0, 2000.0, 1000.0)
    assert not reach.is_lost(first)
    later = reach.record(db, "box", ok=False, error="refused", now=2599.0)
    assert later.failing_since == 2000.0 and not reach.is_lost(later)
    lost = reach.record(db, "box", ok=False, error="timed out", now=2600.0)
    assert reach.is_lost(lost) and lost.error == "timed out"
    assert reach.lost_reason(lost, "j-1", now=2600.0).startswith("host box unreachable for 10 min (since ")
    back = reach.record(db, "box", ok=True, now=2700.0)
    assert back == reach.Reach("box", 2700.0, None, None, "")

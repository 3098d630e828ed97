"""``max_cost`` (issue 37, budgets) through the CLI: a job over its budget is stopped by its own
supervisor with the laptop gone — as `orch cancel` stops it (the script checkpoints on SIGTERM),
the reason in `orch status`, and `on_finish.power_off` powering the box off without waiting
for a fetch; a host without a price is refused at the field's line."""

from __future__ import annotations

import json
import sys

import pytest

from tests.support.orch import TICKER, Orch, write_job
from tests.support.poll import wait_until
from tests.support.sshd import SSHServer

PRICE = 360.0  # per hour: 0.10 a second
MAX_COST = 1.5  # 15 s of it: the ticker installs its SIGTERM handler long before


def test_a_job_over_max_cost_stops_itself_checkpoints_and_powers_the_box_off(orch: Orch, sshd: SSHServer) -> None:
    orch("hosts", "add", "priced", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root), "--python", sys.executable, "--price-per-hour", str(PRICE), "--trust")
    off = orch.cwd / "powered-off"
    power_off = json.dumps(["sh", "-c", f"echo off > {off}"])  # the box's shutdown, observable
    spec = write_job(orch.cwd, "capped", "priced", ["python", "tick.py"],
                     f"max_cost: {MAX_COST}\non_finish: {{power_off: true, shutdown_command: {power_off}}}\n")
    (orch.cwd / "ws" / "tick.py").write_text(TICKER)
    planned = json.loads(orch("submit", str(spec), "--dry-run", "--json").stdout)
    assert planned["plan"]["budget"] == {"max_cost": MAX_COST, "price_per_hour": PRICE, "currency": ""}
    job = orch.json("submit", str(spec))["job_id"]

    # the laptop is gone: no orch command until the box has powered itself off
    wait_until(off.exists, what="the supervisor to stop the job and power the box off", timeout=180, interval=0.5)
    status = orch.json("status", job)
    assert status["state"] == "cancelled", status
    assert status["reason"].startswith(f"stopped: max_cost {MAX_COST:.2f} reached ("), status["reason"]
    assert "360/h for " in status["reason"] and status["budget_reached"] is True
    job_dir = orch.job_dir(job)
    assert (job_dir / "outputs" / "checkpoint-1").exists()  # stopped as orch cancel stops: SIGTERM first
    log = (job_dir / "logs" / "node0.log").read_text()
    assert "max_cost reached, powering off without waiting for `orch fetch`" in log, log
    assert "stopped: max_cost" in orch("status", job).stdout


def test_every_attempt_counts_and_a_resume_after_a_budget_stop_grants_the_budget_again(
        orch: Orch, sshd: SSHServer) -> None:
    orch("hosts", "add", "priced", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root), "--python", sys.executable, "--price-per-hour", str(PRICE), "--trust")
    spec = write_job(orch.cwd, "attempts", "priced", ["python", "tick.py"], "max_cost: 3\n")  # 30 s in all
    (orch.cwd / "ws" / "tick.py").write_text(TICKER)
    job = orch.json("submit", str(spec))["job_id"]
    outputs = orch.job_dir(job) / "outputs"
    wait_until(lambda: any(outputs.glob("attempt-1-*")), what="the first attempt to run", timeout=120)
    orch("cancel", job, "--grace", "10")  # by hand: the attempt's time still counts
    first = orch.json("status", job)
    assert first["state"] == "cancelled" and first["reason"] == "cancelled by SIGTERM"

    orch("resume", job)
    wait_until(lambda: orch.json("status", job).get("budget_reached") is True, what="the budget to stop attempt 2",
               timeout=180)
    second = orch.json("status", job)
    assert second["attempt"] == 2 and second["run_s_before"] == pytest.approx(first["ended"] - first["started"], abs=0.01)
    assert second["reason"].startswith("stopped: max_cost 3.00 reached (") and second["state"] == "cancelled"

    orch("resume", job)  # after a budget stop: max_cost again, counted from 0
    wait_until(lambda: any(outputs.glob("attempt-3-*")), what="the third attempt to run", timeout=120)
    third = orch.json("status", job)
    assert third["attempt"] == 3 and third["run_s_before"] == 0 and third["state"] == "running"
    orch("cancel", job, "--grace", "10")


def test_max_cost_on_a_host_without_a_price_is_refused_at_its_line(orch: Orch) -> None:
    spec = write_job(orch.cwd, "unpriced", "local", ["python", "-c", "pass"], "max_cost: 2\n")
    refused = orch("submit", str(spec), check=2)
    assert f"{spec.name}:7:11: max_cost: no price is known for local" in refused.stderr, refused.stderr
    assert "`local` is this machine and has no price; or leave max_cost out" in refused.stderr
    assert orch.json("status") == []  # nothing started

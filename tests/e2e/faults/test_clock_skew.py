"""A server whose clock is an hour ahead of the laptop's, or an hour behind (issue 23, class 9).

The loopback sshd serves two plain users whose orch root holds the harness's ``clock_shift_s``
(tests/support/serverhooks.py, remote_payload/jobdir/testclock.py): their helper and
supervisors live an hour off, and the job's script writes its metrics' times from the same
shifted clock. Through the CLI, `orch
status` (ELAPSED, ETA, COST, the times it reports) and `orch queue` (SINCE) must be what the
laptop's own clock says, never `1h00m` of skew nor `0s`.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.support.orch import Orch, write_job
from tests.support.poll import wait_until
from tests.support.serverhooks import set_hooks
from tests.support.sshd import SSHServer, ensure_user

PRICE = 3.6  # per hour: one cent a second... of the laptop's clock
JOB = """\
import json, os, pathlib, time
shift = @SHIFT@  # this server's clock
release = pathlib.Path(os.environ["ORCH_JOB_DIR"]) / "release"
for step in range(1, 11):
    time.sleep(0.5)
    with open(os.environ["ORCH_METRICS"], "a") as f:
        f.write(json.dumps({"step": step, "total_steps": 100, "loss": 3 - step / 10, "time": time.time() + shift}) + "\\n")
deadline = time.time() + 300
while not release.exists() and time.time() < deadline:
    time.sleep(0.1)
"""


def skewed_user(name: str, shift_s: int, sshd: SSHServer) -> None:
    """A login user that accepts the test key and whose orch root (``~/orch``) shifts orch's
    clock and has one fake GPU."""
    ensure_user(name)
    home = Path(f"/home/{name}")
    (home / ".ssh").mkdir(mode=0o700, exist_ok=True)
    (home / ".ssh" / "authorized_keys").write_text(Path(str(sshd.client_key) + ".pub").read_text())
    subprocess.run(["chown", "-R", f"{name}:{name}", str(home)], check=True)
    set_hooks(home / "orch", owner=name, clock_shift_s=shift_s, gpus=1)


@pytest.mark.parametrize("user, shift_s", [("orchahead", 3600), ("orchbehind", -3600)])
def test_status_and_queue_are_right_when_the_server_clock_is_an_hour_off(
        orch: Orch, sshd: SSHServer, user: str, shift_s: int) -> None:
    skewed_user(user, shift_s, sshd)
    orch("hosts", "add", "skewed", "--ssh", f"ssh -p {sshd.port} {user}@127.0.0.1", "--identity",
         str(sshd.client_key), "--python", "/usr/bin/python3", "--price-per-hour", str(PRICE), "--trust")
    spec = write_job(orch.cwd, "skew", "skewed", ["python3", "skew.py"])
    (orch.cwd / "ws" / "skew.py").write_text(JOB.replace("@SHIFT@", str(shift_s)))
    before = time.time()
    job = orch.json("submit", str(spec))["job_id"]
    wait_until(lambda: (orch.json("status", job).get("metrics") or {}).get("step") == 10, what="step 10", timeout=120)
    time.sleep(2)
    status = orch.json("status", job)
    now = time.time()
    progress = status["progress"]
    assert status["state"] == "running" and before - 5 <= status["started"] <= now, (status["started"], before)
    assert 2 <= progress["elapsed_s"] <= now - before + 5, progress  # skewed: 0 s (ahead) or 3600 s (behind)
    assert 0 < progress["eta_s"] < 600, progress  # skewed: 1h00m more (ahead) or 0 s (behind)
    assert progress["cost"] == pytest.approx(PRICE * progress["elapsed_s"] / 3600)
    table = orch("status", job, env={"COLUMNS": "80"}).stdout
    assert "1h" not in table and "0.00" not in table, table
    granted = orch.json("queue", "skewed")[0]["jobs"][0]["granted"]
    assert before - 5 <= granted <= now  # `orch queue`'s SINCE, on the laptop's clock
    (Path(f"/home/{user}/orch/jobs") / job / "release").touch()
    done = orch.wait_state(job, ("succeeded", "failed", "lost", "cancelled"))
    assert done["state"] == "succeeded"
    final = orch.json("status", job)
    assert before <= final["ended"] <= time.time() + 5 and 2 <= final["progress"]["elapsed_s"] <= time.time() - before

"""``orch spend`` through the CLI over real jobs (issue 37, budgets): this month's cost per host and
per provider from the laptop's records — a priced host's jobs cost what `orch status` showed, a
job on `local` counts its hours with no cost — with no host asked; another month is empty; a
wrong month is exit 2; the Python API answers the same. Balances against a provider stand-in: tests/e2e/provider/test_budget.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.orch import Orch, write_job
from tests.support.sshd import SSHServer

PRICE = 36.0  # per hour: 0.01 a second


def test_spend_sums_this_months_jobs_per_host_and_provider_from_the_records(orch: Orch, sshd: SSHServer) -> None:
    orch("hosts", "add", "priced", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root), "--python", sys.executable, "--price-per-hour", str(PRICE), "--trust")
    costs = []
    for name, host in (("one", "priced"), ("two", "priced"), ("here", "local")):
        spec = write_job(orch.cwd, name, host, ["python", "-c", "import time; time.sleep(1)"])
        done = orch.json("submit", str(spec), "--follow")
        assert done["state"] == "succeeded", done
        costs.append(orch.json("status", done["job_id"])["progress"]["cost"])  # records the final row
    assert costs[2] is None and all(c > 0 for c in costs[:2])

    orch("hosts", "rm", "priced")  # the records alone: a removed entry's jobs keep their recorded cost
    found = orch.json("spend")
    rows = {row["host"]: row for row in found["hosts"]}
    assert set(rows) == {"priced", "local"} and len(found["jobs"]) == 3 and found["unfinished"] == 0
    assert rows["priced"]["jobs"] == 2 and rows["priced"]["cost"] == pytest.approx(costs[0] + costs[1], rel=1e-3)
    assert rows["priced"]["provider"] == "?"  # its entry is gone
    assert rows["local"]["jobs"] == 1 and rows["local"]["cost"] is None and rows["local"]["unpriced_jobs"] == 1
    assert rows["local"]["hours"] > 0
    assert found["providers"] == [{"provider": "?", "currency": "", "cost": rows["priced"]["cost"],
                                   "hosts": ["priced"]}]
    assert found["balances"] == []  # no provider host entry: no account to ask

    table = orch("spend").stdout
    assert "3 job(s)" in table and "priced" in table and "local" in table, table
    assert f"{rows['priced']['cost']:.2f}" in table
    api = subprocess.run([sys.executable, "-c", "import json; from orchestrator.api import spend; "
                          "print(json.dumps(spend().as_json()))"], env=orch.env, capture_output=True, text=True,
                         timeout=120, check=True)
    assert json.loads(api.stdout) == found  # the Python API's answer is the command's --json

    assert orch.json("spend", "--month", "2001-01") == dict(found, hosts=[], providers=[], jobs=[], month="2001-01")
    wrong = orch("spend", "--month", "December", check=2)
    assert "--month 'December': give a month as YYYY-MM" in wrong.stderr

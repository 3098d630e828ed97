"""Budgets on a rented box (issue 37, item 6) through the CLI against the AutoDL stand-in: a job
over its ``max_cost`` stops itself and the box powers itself off with no laptop command (the
supervisor's ``on_finish`` shutdown, as `shutdown` inside an AutoDL instance), and `orch spend`
shows the host's cost in CNY and the account's wallet — or one line when the token is unset."""

from __future__ import annotations

import pytest

from tests.e2e.provider.test_autodl import TOKEN_ENV, add, inside_shutdown
from tests.support.orch import TICKER, Orch, write_job
from tests.support.poll import wait_until
from tests.support.standin.autodl import AutoDLStandin

MAX_COST = 0.008  # CNY: about 15 s at the stand-in's 1.98 CNY/h


def test_a_job_over_max_cost_powers_its_box_off_with_the_laptop_gone_and_spend_shows_the_wallet(
        orch: Orch, autodl: AutoDLStandin) -> None:
    orch.env[TOKEN_ENV] = autodl.token
    uuid = add(orch, autodl, "cap", 0)
    box = autodl.boxes[uuid]
    orch("up", "cap", "--trust")  # keeps AutoDL's price, 1.98 CNY/h, in the entry
    spec = write_job(orch.cwd, "capped", "cap", ["python", "tick.py"],
                     f"max_cost: {MAX_COST}\non_finish: {{power_off: true, "
                     f"shutdown_command: {inside_shutdown(autodl, uuid)}}}\n")
    (orch.cwd / "ws" / "tick.py").write_text(TICKER)
    job = orch.json("submit", str(spec))["job_id"]

    # the laptop is gone: nothing but the box itself acts until AutoDL says it is off
    wait_until(lambda: box.status == "shutdown", what="the box to power itself off at its budget", timeout=180,
               interval=0.5)
    billed = autodl.ledger()[uuid]
    orch("up", "cap")  # to read what it says, as a person would
    status = orch.json("status", job)
    assert status["state"] == "cancelled" and status["budget_reached"] is True, status
    assert status["reason"].startswith(f"stopped: max_cost {MAX_COST:g} CNY reached ("), status["reason"]
    assert "1.98 CNY/h for " in status["reason"]
    assert "stopped: max_cost" in orch("logs", job).stdout
    orch("down", "cap")  # billing stops: the wallet holds still

    found = orch.json("spend")
    row = next(r for r in found["hosts"] if r["host"] == "cap")
    assert (row["provider"], row["currency"], row["jobs"]) == ("autodl", "CNY", 1)
    assert row["cost"] == pytest.approx(status["progress"]["cost"], abs=1e-6) and row["cost"] >= MAX_COST
    assert found["providers"] == [{"provider": "autodl", "currency": "CNY", "cost": row["cost"], "hosts": ["cap"]}]
    [wallet] = found["balances"]
    assert (wallet["provider"], wallet["token_env"], wallet["currency"], wallet["note"]) == \
        ("autodl", TOKEN_ENV, "CNY", "")
    assert isinstance(wallet["amount"], float) and billed > 0
    assert f"balance autodl (${TOKEN_ENV}, {autodl.url}): {wallet['amount']:.2f} CNY" in orch("spend").stdout

    unset = orch("spend", env={TOKEN_ENV: ""})  # the sums still come; the balance is one line saying why not
    assert f"balance autodl (${TOKEN_ENV}, {autodl.url}): the autodl token variable ${TOKEN_ENV} is not set" \
        in unset.stdout, unset.stdout

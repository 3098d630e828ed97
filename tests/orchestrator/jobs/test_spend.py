"""``orch spend``'s sums (orchestrator/jobs/spend.py) over made-up records, pure logic: a job across
a month's edge counts its part inside the month, a multi-node job's cost is shared by its hosts, an
unfinished one counts until now, and a provider account's failure or silence is one line. The
command itself over real jobs: tests/e2e/daily/test_spend.py, tests/e2e/provider/test_budget.py."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import Host, Inventory, ProviderRef
from orchestrator.jobs.spend import month_bounds, spend
from orchestrator.providers.accounts import Account
from orchestrator.providers.api import Balance, ProviderAuthError
from orchestrator.state.registry import JobRecord

H = 3600.0


def at(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M").timestamp()  # the laptop's local time, as spend reads it


def record(job_id: str, hosts: list[str], started: float, ended: float | None, cost: float | None = None,
           state: str = "succeeded") -> JobRecord:
    final = {"cost": cost} if cost is not None else None
    return JobRecord(job_id, job_id, "job.yaml", hosts, "/r/jobs/" + job_id, started, state,
                     {"started": started, "ended": ended}, final)


@pytest.fixture
def inventory(tmp_path: Path) -> Inventory:
    inv = Inventory(tmp_path)
    inv.save(Host(name="a", address="10.0.0.1", price_per_hour=2.0,
                  provider=ProviderRef(name="autodl", instance="u-1", token_env="TOK_A")))
    inv.save(Host(name="b", address="10.0.0.2", price_per_hour=1.0))
    return inv


def test_a_job_across_the_months_edge_counts_its_part_in_each(inventory: Inventory) -> None:
    job = record("edge", ["a"], at("2026-11-30 22:00"), at("2026-12-01 02:00"), cost=8.0)
    nov, dec = spend([job], inventory, "2026-11"), spend([job], inventory, "2026-12")
    assert (nov.hosts[0].cost, nov.hosts[0].hours) == (4.0, 2.0) and (dec.hosts[0].cost, dec.hosts[0].hours) == (4.0, 2.0)
    assert dec.providers[0].provider == "autodl" and dec.providers[0].currency == "CNY"
    assert spend([job], inventory, "2026-10").hosts == []


def test_a_multi_node_job_is_shared_and_an_unfinished_one_counts_until_now(inventory: Inventory) -> None:
    both = record("both", ["a", "b"], at("2026-12-02 10:00"), at("2026-12-02 12:00"))  # no final row: prices now
    running = record("run", ["b"], at("2026-12-03 10:00"), None, state="running")
    found = spend([both, running], inventory, "2026-12", now=at("2026-12-03 13:00"))
    rows = {h.host: h for h in found.hosts}
    assert rows["a"].cost == pytest.approx(3.0) and rows["b"].cost == pytest.approx(3.0 + 3.0)  # (2+1)×2 h shared
    assert rows["b"].hours == pytest.approx(2.0 + 3.0) and found.unfinished == 1  # each node ran the job's hours
    assert [(p.provider, p.cost) for p in found.providers] == [("", pytest.approx(6.0)), ("autodl", pytest.approx(3.0))]


def test_balances_are_asked_once_per_account_and_a_failure_is_one_line(inventory: Inventory) -> None:
    inventory.save(Host(name="c", address="10.0.0.3", provider=ProviderRef(name="autodl", instance="u-2",
                                                                           token_env="TOK_A")))
    inventory.save(Host(name="d", address="10.0.0.4", provider=ProviderRef(name="vast", instance="9",
                                                                           token_env="TOK_V")))
    asked = []

    def balance_of(account: Account) -> Balance | None:
        asked.append(account.token_env)
        if account.provider == "vast":
            raise ProviderAuthError("vast", "balance", "the token was refused (HTTP 404)")
        return Balance(12.5, "CNY")

    found = spend([], inventory, "2026-12", balance_of=balance_of)
    assert asked == ["TOK_A", "TOK_V"]
    assert [(b.provider, b.amount, b.currency, b.note) for b in found.balances] == [
        ("autodl", 12.5, "CNY", ""), ("vast", None, "", "vast balance: the token was refused (HTTP 404)")]
    silent = spend([], inventory, "2026-12", balance_of=lambda ref: None)
    assert silent.balances[0].note == "autodl reports no balance"


def test_a_month_is_yyyy_mm() -> None:
    assert month_bounds("2026-12")[0] == "2026-12" and month_bounds("2026-12")[2] == at("2027-01-01 00:00")
    with pytest.raises(UsageError, match="give a month as YYYY-MM"):
        month_bounds("12/2026")

"""job.json's budget from ``max_cost`` and the hosts' prices (orchestrator/plan/budget.py), pure.
The refusal through the CLI, at the job file's line: tests/e2e/daily/test_budget.py."""

from __future__ import annotations

import pytest

from orchestrator.hosts.inventory import Host, ProviderRef
from orchestrator.plan.budget import Refused, budget


def host(name: str, price: float | None, provider: str | None = None, **kw: object) -> Host:
    ref = ProviderRef(name=provider, instance="i-1", token_env="T") if provider else None
    return Host(name=name, address="10.0.0.1", price_per_hour=price, provider=ref, **kw)


def test_no_max_cost_no_budget_even_without_prices() -> None:
    assert budget(None, [host("a", None)]) is None


def test_the_price_is_every_node_together_in_the_providers_currency() -> None:
    assert budget(5, [host("a", 1.98, "autodl"), host("b", 2.5, "autodl")]) == \
        {"max_cost": 5.0, "price_per_hour": 4.48, "currency": "CNY"}
    assert budget(1, [host("p", 3.6)]) == {"max_cost": 1.0, "price_per_hour": 3.6, "currency": ""}


def test_a_host_without_a_price_is_refused_with_the_way_on() -> None:
    with pytest.raises(Refused, match=r"no price is known for b, so the job.s cost cannot be counted: give b one \(orch hosts add b \.\.\. --price-per-hour"):
        budget(5, [host("a", 1.0), host("b", None)])
    with pytest.raises(Refused, match="`local` is this machine and has no price"):
        budget(5, [Host(name="local", kind="local")])


def test_mixed_currencies_and_slurm_clusters_are_refused() -> None:
    with pytest.raises(Refused, match=r"different currencies \(CNY, USD\)"):
        budget(5, [host("a", 1.0, "autodl"), host("b", 1.0, "vast")])
    with pytest.raises(Refused, match="Slurm cluster"):
        budget(5, [host("c", 1.0, scheduler="slurm")])

"""`orch rent --interruptible` (issue 40 item 4) through the CLI against the vast.ai and RunPod
stand-ins: the offer shown with its bid and its on-demand price, the instance rented at that bid
and working as a host, a preemption (vast: outbid; RunPod: a spot pod interrupted) shown as
``preempted`` by `orch instances`, refused by a connection and seen by the library calls
(``access.provisioned.instance_now``, ``Orch().instances()``); a bid the provider refuses (its
minimum rose after the search) exits 4 with the provider's words and leaves nothing billing;
AutoDL has no interruptible instances."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest

from orchestrator.access.provisioned import instance_now
from orchestrator.api import Orch as PythonOrch
from orchestrator.hosts.inventory import Inventory
from orchestrator.providers.open import provider_of
from tests.support.orch import Orch
from tests.support.poll import wait_until
from tests.support.standin.boxes import StandinServer
from tests.support.tiers import needs


@dataclass
class Spot:
    """One marketplace stand-in as the tests rent interruptible instances from it."""

    name: str
    standin: StandinServer
    token_env: str
    gpu: str
    bid: float        # the least bid of the cheapest matching offer (the bid orch places)
    on_demand: float  # that offer's on-demand price
    preempt: str      # the stand-in's control that takes the instance's GPU
    words: str        # the provider's words for a bid under its minimum (the stand-in's)


@pytest.fixture(params=["vast", "runpod"])
@needs("root")
def spot(request: pytest.FixtureRequest, orch: Orch) -> Spot:
    if request.param == "vast":
        # offer 4101 (reliability 0.995, 250 GB): min_bid 0.206, dph_total 0.412
        found = Spot("vast", request.getfixturevalue("vast"), "ORCH_TEST_VAST_KEY", "RTX_4090", 0.206, 0.412,
                     "outbid", "is below the minimum bid")
    else:
        # the community cloud's RTX 4090: least bid 0.2 per GPU, on demand 0.34
        found = Spot("runpod", request.getfixturevalue("runpod"), "ORCH_TEST_RUNPOD_KEY", "RTX 4090", 0.2, 0.34,
                     "preempt", "is lower than the current minimum bid price")
    orch.env[found.token_env] = found.standin.token
    return found


def control(standin: StandinServer, action: str, **args: Any) -> dict[str, Any]:
    """A test-only call of a stand-in (``/standin/ACTION``, no key)."""
    req = urllib.request.Request(f"{standin.url}/standin/{action}", data=json.dumps(args).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=30) as answer:
        return json.loads(answer.read())


def rent_args(s: Spot, name: str, *extra: str) -> list[str]:
    return ["rent", name, "--provider", s.name, "--gpu", s.gpu, "--token-env", s.token_env,
            "--api-url", s.standin.url, "--python", "/usr/bin/python3", "--interruptible", *extra]


def test_an_interruptible_instance_shows_its_bid_works_and_its_preemption_is_seen(
        orch: Orch, spot: Spot, monkeypatch: pytest.MonkeyPatch) -> None:
    standin = spot.standin
    before = set(standin.boxes)
    asked = orch(*rent_args(spot, "s0"), check=2)
    assert f"bid {spot.bid:.3g} USD/h (interruptible; on demand {spot.on_demand:.3g} USD/h)" in asked.stderr
    assert " --interruptible " in asked.stderr and asked.stderr.rstrip().endswith("--yes")
    assert set(standin.boxes) == before
    low = orch(*rent_args(spot, "s0", "--bid", "0.01"), check=4)
    assert "no interruptible offer of 1x" in low.stderr and "minimum bid at or under 0.01 USD/h" in low.stderr

    user = standin.next_user()
    rented = orch(*rent_args(spot, "s1", "--yes", "--user", user, "--root", "~/orch"))
    (instance,) = set(standin.boxes) - before
    assert f"rented {spot.name} instance {instance} at bid {spot.bid:.3g} USD/h, interruptible" in rented.stderr
    assert standin.boxes[instance].price == pytest.approx(spot.bid)  # billed at the bid, not on demand
    assert orch("exec", "s1", "--", "whoami").stdout.strip() == user
    entry = json.loads((orch.home / "hosts" / "s1.json").read_text())
    assert entry["price_per_hour"] == pytest.approx(spot.bid)

    assert control(standin, spot.preempt, id=instance).get("error") is None
    assert standin.billing() == []  # the GPU is gone: nothing but the disk bills
    (account,) = orch.json("instances")
    (row,) = [i for i in account["instances"] if i["id"] == instance]
    assert row["state"] == "preempted" and row["host"] == "s1" and row["billing"] is False
    table = orch("instances").stdout
    assert any(f" {instance} " in line and "preempted" in line for line in table.splitlines())
    refused = orch("exec", "s1", "--", "true", check=3)
    assert f"the {spot.name} instance {instance} is" in refused.stderr

    monkeypatch.setenv("ORCH_HOME", str(orch.home))
    monkeypatch.setenv(spot.token_env, standin.token)
    found = instance_now(Inventory(orch.home).get("s1"))
    assert found.preempted and found.state == "preempted" and found.interruptible
    (holding,) = PythonOrch(home=orch.home).instances()
    assert [item.instance.state for item in holding.instances if item.instance.id == instance] == ["preempted"]

    if spot.name == "vast":  # a higher bid wins the GPU back (vast's change bid)
        provider_of(Inventory(orch.home).get("s1")).change_bid(instance, 0.5)
        wait_until(lambda: instance_now(Inventory(orch.home).get("s1")).state == "running",
                   what="the instance running again after a higher bid", timeout=60)
        assert any(c == f"PUT /api/v0/instances/bid_price/{instance}/" for c in standin.calls)
    orch("release", "s1", "--yes")
    assert standin.billing() == [] and not (orch.home / "hosts" / "s1.json").exists()


def test_a_bid_the_provider_refuses_exits_4_with_its_words_and_leaves_nothing_billing(
        orch: Orch, spot: Spot) -> None:
    standin = spot.standin
    before = set(standin.boxes)
    control(standin, "min_bid_rises", by=0.1)  # the minimum rises between orch's search and its create
    refused = orch(*rent_args(spot, "s2", "--yes"), check=4)
    assert f"error: {spot.name} create: " in refused.stderr and spot.words in refused.stderr
    assert not (orch.home / "hosts" / "s2.json").exists() and standin.billing() == []
    left = [b for b in set(standin.boxes) - before if standin.boxes[b].status not in ("destroyed", "TERMINATED")]
    assert left == []  # vast's stopped instance made for the refused bid is destroyed; RunPod made none


def test_a_bid_needs_interruptible_and_autodl_has_no_interruptible_instances(orch: Orch) -> None:
    bid = orch("rent", "x1", "--provider", "vast", "--gpu", "RTX_4090", "--bid", "0.2", check=2)
    assert "a bid is for an interruptible instance: add --interruptible" in bid.stderr
    above = orch("rent", "x1", "--provider", "vast", "--gpu", "RTX_4090", "--interruptible", "--bid", "0.9",
                 "--max-price", "0.5", check=2)
    assert "the bid 0.9 is above --max-price 0.5" in above.stderr
    autodl = orch("rent", "x1", "--provider", "autodl", "--gpu", "4090D", "--interruptible", check=2)
    assert "AutoDL has no interruptible instances" in autodl.stderr
    assert not (orch.home / "hosts").exists() or not list((orch.home / "hosts").iterdir())

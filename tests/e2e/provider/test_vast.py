"""vast.ai against its stand-in (real HTTP, real sshd instances): the account's instances
listed from the v1 list (the v0 list the fallback), the credit, the refused key as vast says
it, and the states of an instance whose container dies while it starts."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from orchestrator.providers.api import ProviderAuthError
from orchestrator.providers.vast import Vast
from tests.support.standin.vast import VastStandin


def control(vast: VastStandin, action: str, **args: Any) -> dict[str, Any]:
    """A test-only call of the stand-in (``/standin/ACTION``)."""
    req = urllib.request.Request(f"{vast.url}/standin/{action}", data=json.dumps(args).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=30) as answer:
        return json.loads(answer.read())


def test_instances_lists_every_instance_of_the_account_with_its_label_gpu_price_and_age(vast: VastStandin) -> None:
    made = control(vast, "console_create", label="forgotten in the console")["created"]
    adapter = Vast(vast.token, vast.url)
    calls = len(vast.calls)
    found = {i.id: i for i in adapter.instances()}
    assert vast.calls[calls:] == ["GET /api/v1/instances/"]
    mine = found[made]
    assert (mine.label, mine.gpu, mine.currency) == ("forgotten in the console", "1x RTX 4090", "USD")
    assert mine.state in ("creating", "starting", "running") and mine.price_per_hour is not None
    assert mine.created_at is not None
    adapter.release(made)
    assert made not in {i.id for i in adapter.instances()}
    assert made not in control(vast, "ledger")["billing"]


def test_the_credit_is_the_accounts_and_a_wrong_key_is_refused_as_vast_says_it(vast: VastStandin) -> None:
    balance = Vast(vast.token, vast.url).balance()
    assert balance is not None and (balance.amount, balance.currency) == (25.0, "USD")
    with pytest.raises(ProviderAuthError, match=r"vast instances: the key was refused \(HTTP 404: Invalid user key\)"):
        Vast("wrong", vast.url).instances()

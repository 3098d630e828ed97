"""The vast.ai adapter against a local HTTP server that answers what a test says (real HTTP; no
sshd): the key in a Bearer header only, offers filtered and ordered, odd or hostile fields
refused, states mapped, a create sent once whatever happens, the provider's own words in every
error; and the token both marketplaces read from the variable or else the OS keyring. RunPod's
adapter: test_runpod_api.py."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from orchestrator.errors import UsageError
from orchestrator.providers.api import (CreateUncertain, Offer, OutOfStock, ProviderAuthError, ProviderError,
                                        ProviderUnreachable, Wanted)
from orchestrator.providers.open import open_named
from orchestrator.providers.vast import Vast
from tests.support.orch import dead_port

Answer = Callable[[str, str, dict[str, str]], tuple[int, bytes]]


def answer(body: Any, status: int = 200, delay_s: float = 0) -> Answer:
    """``body`` as JSON with ``status``, after ``delay_s`` seconds."""
    raw = b"" if body is None else json.dumps(body).encode()
    return lambda method, path, headers: (time.sleep(delay_s), (status, raw))[1]


VAST_ROWS = [
    {"id": 7, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.5, "disk_space": 100, "reliability2": 0.99,
     "gpu_ram": 24576, "geolocation": "Norway"},
    {"id": 8, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.3, "disk_space": 100, "reliability2": 0.99},
    {"id": 9, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.2, "disk_space": 100, "reliability2": 0.5},
    {"id": 10, "gpu_name": "RTX 3090", "num_gpus": 1, "dph_total": 0.1, "disk_space": 100, "reliability2": 0.99},
    {"id": "11", "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.05},  # an id that is not a number
    {"id": 12, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": -1},
    "not an offer",
]


def test_vast_search_sends_the_filters_and_keeps_only_offers_that_meet_them_cheapest_first(
        api: dict[str, Any]) -> None:
    api["answer"] = answer({"offers": VAST_ROWS})
    offers = Vast("k", api["url"]).search(Wanted(gpu="RTX_4090", max_price=0.6, disk_gb=50))
    assert [(o.id, o.price_per_hour) for o in offers] == [("8", 0.3), ("7", 0.5)]
    assert offers[1].describe() == "1x RTX 4090 (24 GB), 0.5 USD/h, reliability 0.99, disk up to 100 GB, Norway"
    method, path, headers, body = api["seen"][-1]
    assert (method, path, headers["Authorization"]) == ("POST", "/api/v0/bundles/", "Bearer k")
    q = json.loads(body)
    assert q["gpu_name"] == {"eq": "RTX 4090"} and q["num_gpus"] == {"eq": 1} and q["dph_total"] == {"lte": 0.6}
    assert q["disk_space"] == {"gte": 50} and q["reliability"] == {"gte": 0.95} and q["rentable"] == {"eq": True}
    assert q["order"] == [["dph_total", "asc"]] and "k" not in path


@pytest.mark.parametrize("row", [
    {"ssh_host": "a b", "ssh_port": 22}, {"ssh_host": "h;rm -rf /", "ssh_port": 22},
    {"ssh_host": "h", "ssh_port": 70000}, {"ssh_host": "h", "ssh_port": None}, {"ssh_host": None, "ssh_port": 22},
])
def test_vast_an_incomplete_or_hostile_endpoint_is_an_error_never_a_guess(api: dict[str, Any],
                                                                          row: dict[str, Any]) -> None:
    api["answer"] = answer({"instances": {"actual_status": "running", "intended_status": "running", **row}})
    with pytest.raises(ProviderError, match="vast instance: no SSH endpoint yet"):
        Vast("k", api["url"]).endpoint("5")


@pytest.mark.parametrize(("actual", "intended", "state"), [
    ("running", "running", "running"), ("running", "stopped", "stopping"), ("exited", "stopped", "off"),
    ("loading", "running", "starting"), (None, "running", "creating"), ("exited", "running", "failed"),
    ("offline", "stopped", "off"),
])
def test_vast_states_are_read_from_what_runs_and_what_was_asked(api: dict[str, Any], actual: str | None,
                                                                intended: str, state: str) -> None:
    api["answer"] = answer({"instances": {"actual_status": actual, "intended_status": intended, "dph_total": 0.4,
                                          "ssh_host": "ssh4.vast.ai", "ssh_port": 10022}})
    found = Vast("k", api["url"]).instance("5")
    assert found.state == state and found.price_per_hour == 0.4 and found.currency == "USD"
    assert api["seen"][-1][1] == "/api/v0/instances/5/?owner=me"


def test_vast_a_destroyed_instance_is_released_and_a_refusal_carries_vasts_words(api: dict[str, Any]) -> None:
    api["answer"] = answer({"instances": None})
    assert Vast("k", api["url"]).state("5") == ("released", "destroyed")
    api["answer"] = answer({"success": False, "error": "invalid_state", "msg": "Instance is loading."})
    with pytest.raises(ProviderError, match="vast stop: Instance is loading."):
        Vast("k", api["url"]).power_off("5")
    api["answer"] = answer({"success": False, "msg": "Required resources are unavailable."}, status=400)
    with pytest.raises(OutOfStock, match="vast start: HTTP 400: Required resources are unavailable."):
        Vast("k", api["url"]).power_on("5")
    assert json.loads(api["seen"][-1][3]) == {"state": "running"}


OFFER = Offer(provider="vast", id="4101", gpu="RTX 4090", count=1, price_per_hour=0.4)


@pytest.mark.parametrize(("reply", "kind", "words"), [
    (answer({"success": False, "error": "upstream"}, status=502), CreateUncertain, "may or may not have rented"),
    (answer({"success": False, "msg": "Offer 4101 is no longer available."}, status=400), ProviderError,
     "vast create: HTTP 400: Offer 4101 is no longer available."),
    (answer({"msg": "bad key"}, status=401), ProviderAuthError, "vast create: the token was refused (HTTP 401)"),
    (answer({"success": True}), ProviderError, "names no new instance"),
])
def test_vast_create_is_sent_once_whatever_the_answer(api: dict[str, Any], reply: Answer, kind: type,
                                                      words: str) -> None:
    api["answer"] = reply
    before = len(api["seen"])
    with pytest.raises(kind) as caught:
        Vast("k", api["url"]).create(OFFER, "img", 40, "orch-g", "ssh-ed25519 AAAA x")
    assert type(caught.value) is kind and words in str(caught.value)
    assert [(m, p) for m, p, _, _ in api["seen"][before:]] == [("PUT", "/api/v0/asks/4101/")]


def test_a_create_that_times_out_is_uncertain_and_one_never_sent_is_not(api: dict[str, Any],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    api["answer"] = answer({"success": True, "new_contract": 5}, delay_s=2)
    monkeypatch.setenv("ORCH_PROVIDER_TIMEOUT_S", "0.5")
    with pytest.raises(CreateUncertain, match="timed out. The provider may or may not have rented an instance"):
        Vast("k", api["url"]).create(OFFER, "img", 40, "orch-g", "ssh-ed25519 AAAA x")
    with pytest.raises(ProviderUnreachable) as refused:
        Vast("k", f"http://127.0.0.1:{dead_port()}").create(OFFER, "img", 40, "orch-g", "ssh-ed25519 AAAA x")
    assert type(refused.value) is ProviderUnreachable and refused.value.exit_code == 3


def test_vast_create_rents_the_offer_with_ssh_and_attaches_the_key_to_the_instance(api: dict[str, Any]) -> None:
    api["answer"] = answer({"success": True, "new_contract": 81})
    vast = Vast("k", api["url"])
    assert vast.create(OFFER, "pytorch/pytorch", 60, "orch-g", "ssh-ed25519 AAAA x") == "81"
    assert json.loads(api["seen"][-1][3]) == {"client_id": "me", "image": "pytorch/pytorch", "disk": 60,
                                              "label": "orch-g", "runtype": "ssh_proxy", "env": {}}
    vast.authorize_key("81", "ssh-ed25519 AAAA x")
    assert api["seen"][-1][:2] == ("POST", "/api/v0/instances/81/ssh/")
    assert json.loads(api["seen"][-1][3]) == {"ssh_key": "ssh-ed25519 AAAA x"}


def test_the_token_comes_from_the_variable_else_the_keyring_and_neither_is_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "keyring.py").write_text(  # the keyring package's API, holding one entry
        "def get_password(service, user):\n"
        "    return 'from-keyring' if (service, user) == ('orch', 'ORCH_KR_TOKEN') else None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "keyring", raising=False)
    monkeypatch.setenv("ORCH_KR_TOKEN", "")
    vast = open_named("vast", "ORCH_KR_TOKEN", "http://127.0.0.1:1")
    assert isinstance(vast, Vast) and vast.http.headers["Authorization"] == "Bearer from-keyring"
    monkeypatch.setenv("ORCH_KR_TOKEN", "from-env")
    assert open_named("runpod", "ORCH_KR_TOKEN", None).rest.headers["Authorization"] == "Bearer from-env"
    monkeypatch.delenv("ORCH_KR_TOKEN")
    with pytest.raises(UsageError, match=r"\$ORCH_OTHER_TOKEN is not set"):
        open_named("vast", "ORCH_OTHER_TOKEN", None)

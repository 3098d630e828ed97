"""`orch rent --provider autodl` through the CLI against the AutoDL stand-in: the Pro order shown
and nothing created without a yes, words that name no GPU, image or region refused with what
exists, a created instance that runs a real job and that `orch down` and `orch release` leave
billing nothing, errors that carry AutoDL's request_id, and a create that fails ambiguously sent
once and said as such."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from tests.support.orch import Orch
from tests.support.poll import wait_until
from tests.support.standin.autodl import AutoDLStandin

TOKEN_ENV = "ORCH_TEST_AUTODL_TOKEN"


def admin(standin: AutoDLStandin, action: str, **args: Any) -> dict[str, Any]:
    req = urllib.request.Request(f"{standin.url}/standin/{action}", data=json.dumps(args).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=10) as answer:
        return json.loads(answer.read())


def api_call(standin: AutoDLStandin, action: str, body: dict[str, Any]) -> Any:
    """One call of AutoDL's Pro API as a person makes it (the web console's instance, say)."""
    req = urllib.request.Request(f"{standin.url}/api/v1/dev/instance/pro/{action}", method="POST",
                                 data=json.dumps(body).encode(), headers={"Authorization": standin.token})
    answer = json.loads(urllib.request.urlopen(req, timeout=10).read())
    assert answer["code"] == "Success", answer
    return answer["data"]


def rent(orch: Orch, standin: AutoDLStandin, name: str, *extra: str, check: int = 0) -> Any:
    orch.env[TOKEN_ENV] = standin.token
    return orch("rent", name, "--provider", "autodl", "--token-env", TOKEN_ENV, "--api-url", standin.url,
                "--python", "/usr/bin/python3", *extra, check=check)


def test_rent_shows_the_order_creates_nothing_without_a_yes_and_refuses_unknown_words(
        orch: Orch, autodl: AutoDLStandin) -> None:
    before = list(autodl.boxes)
    asked = rent(orch, autodl, "d0", "--gpu", "RTX 4090", "--region", "westDC3", check=2)
    assert "autodl Pro instance: 1x 4090-48G (48 GB), image cuda11.8-cudnn8-devel-ubuntu20.04-py38-torch2.0.0, " \
           "westDC3 (西北B区)" in asked.stderr
    assert "renting starts billing; to rent it: orch rent d0 --provider autodl --gpu 'RTX 4090'" in asked.stderr
    assert "--region westDC3" in asked.stderr and asked.stderr.rstrip().endswith("--yes")
    gpu = rent(orch, autodl, "d0", "--gpu", "A100", "--yes", check=2)
    assert "no AutoDL Pro GPU 'A100'; AutoDL's Pro API documents: H800-80G (h800), 4090-48G (v-48g)" in gpu.stderr
    region = rent(orch, autodl, "d0", "--gpu", "4090D", "--region", "moon", "--yes", check=2)
    assert "no AutoDL region 'moon'; known: westDC2 (西北企业区)" in region.stderr
    image = rent(orch, autodl, "d0", "--gpu", "4090D", "--image", "my-env", "--yes", check=2)
    assert "no AutoDL image 'my-env'" in image.stderr and "one of your own images: none" in image.stderr
    price = rent(orch, autodl, "d0", "--gpu", "4090D", "--max-price", "1", "--yes", check=2)
    assert "autodl takes no --max-price or --min-reliability" in price.stderr
    assert list(autodl.boxes) == before and not (orch.home / "hosts" / "d0.json").exists()
    assert not [c for c in autodl.calls if c.endswith("/create")]


def test_a_rented_pro_instance_runs_a_job_and_down_and_release_leave_nothing_billing(
        orch: Orch, autodl: AutoDLStandin) -> None:
    user = autodl.next_user()  # the stand-in's instances log in as their own user, not root
    admin(autodl, "private_image", image_uuid="image-db8346e037", name="my-env")
    rented = rent(orch, autodl, "d1", "--gpu", "4090D", "--image", "my-env", "--yes", "--root", "~/orch")
    (instance,) = [b for b in autodl.boxes if autodl.boxes[b].user == user]
    box = autodl.boxes[instance]
    assert f"d1: rented autodl instance {instance}; waiting until SSH answers" in rented.stderr
    assert "pinned host key ssh-ed25519 SHA256:" in rented.stderr
    assert f"SSH answers at {user}@127.0.0.1:{box.port}" in rented.stderr  # the user ssh_command names
    assert len([c for c in autodl.calls if c.endswith("/create")]) == 1
    entry = json.loads((orch.home / "hosts" / "d1.json").read_text())
    assert entry["provider"] == {"name": "autodl", "instance": instance, "token_env": TOKEN_ENV,
                                 "api_url": autodl.url}
    assert entry["price_per_hour"] == 1.88 and entry["presets"] == ["autodl"]
    assert autodl.meta[instance]["name"] == "orch-d1" and autodl.meta[instance]["spec"] == "4090D"

    ws = orch.cwd / "ws"
    ws.mkdir()
    (ws / "hello.py").write_text("print('hello from the pro instance', flush=True)\n")
    (orch.cwd / "job.yaml").write_text("name: pro\nhosts: [d1]\nworkspace: {path: ws}\n"
                                       "launch: {nproc_per_node: 1, command: python3 hello.py}\n")
    submit = subprocess.run([sys.executable, "-m", "orchestrator", "submit", "job.yaml", "--follow"], cwd=orch.cwd,
                            env=orch.env, capture_output=True, text=True, timeout=300)
    assert submit.returncode == 0, submit.stderr
    assert "hello from the pro instance" in submit.stdout

    refused = orch("release", "d1", "--yes", check=2)
    assert "is running; power it off first: orch down d1" in refused.stderr
    down = orch("down", "d1")
    assert "d1: off" in down.stderr and autodl.billing() == []
    gone = orch("release", "d1", "--yes")
    assert f"autodl instance {instance} released; the host entry is removed" in gone.stderr
    assert box.status == "released" and autodl.billing() == [] and autodl.ledger()[instance] > 0
    billed = autodl.ledger()
    time.sleep(1.0)
    assert autodl.ledger() == billed  # nothing left billing
    for text in (rented.stderr, submit.stdout, submit.stderr, gone.stderr):
        assert autodl.token not in text and box.password not in text


def test_a_refused_create_names_autodls_words_and_request_id(orch: Orch, autodl: AutoDLStandin) -> None:
    admin(autodl, "stock", refusals=1)
    before = len(autodl.boxes)
    refused = rent(orch, autodl, "d2", "--gpu", "5090", "--yes", check=4)
    assert "error: autodl create: 当前算力规格暂无库存, 请修改配置或稍等再试 (request_id " in refused.stderr
    assert f"(request_id {autodl.request_ids[-1]})" in refused.stderr
    assert len(autodl.boxes) == before and not (orch.home / "hosts" / "d2.json").exists()


def test_a_create_that_fails_ambiguously_is_sent_once_and_says_what_to_check(
        orch: Orch, autodl: AutoDLStandin) -> None:
    admin(autodl, "create_fault", status=502)
    before, calls = list(autodl.boxes), len(autodl.calls)
    failed = rent(orch, autodl, "d3", "--gpu", "5090-p", "--yes", check=4)
    assert "error: autodl create: HTTP 502: upstream timed out (stand-in fault)" in failed.stderr
    assert "may or may not have rented an instance" in failed.stderr and "orch does not try again" in failed.stderr
    assert "(https://www.autodl.com/console)" in failed.stderr
    assert len([c for c in autodl.calls[calls:] if c.endswith("/create")]) == 1
    assert not (orch.home / "hosts" / "d3.json").exists()
    (orphan,) = [b for b in autodl.boxes if b not in before]  # AutoDL did create one: a person releases it
    for action, then in (("power_off", "shutdown"), ("release", "released")):
        wait_until(lambda: autodl.boxes[orphan].status in ("running", "shutdown"), what="the orphan up", timeout=60)
        api_call(autodl, action, {"instance_uuid": orphan})
        wait_until(lambda: autodl.boxes[orphan].status == then, what=f"the orphan {then}", timeout=60)
    assert autodl.billing() == []


def test_orch_instances_lists_the_rented_instance_by_its_host_and_one_made_elsewhere_as_unknown(
        orch: Orch, autodl: AutoDLStandin) -> None:
    rent(orch, autodl, "d4", "--gpu", "5090", "--yes", "--root", "~/orch")
    mine = json.loads((orch.home / "hosts" / "d4.json").read_text())["provider"]["instance"]
    other = api_call(autodl, "create", {"req_gpu_amount": 2, "expand_system_disk_by_gb": 0, "gpu_spec_uuid": "h800",
                                        "image_uuid": "base-image-l2t43iu6uk", "cuda_v_from": 118,
                                        "instance_name": "forgotten"})
    wait_until(lambda: autodl.boxes[other].status == "running", what="the other instance running", timeout=60)
    (account,) = orch.json("instances")
    assert (account["provider"], account["token_env"], account["error"]) == ("autodl", TOKEN_ENV, None)
    listed = {i["id"]: i for i in account["instances"]}
    assert listed[mine]["host"] == "d4" and listed[mine]["label"] == "orch-d4" and listed[mine]["gpu"] == "1x 5090-32G"
    assert (listed[mine]["price_per_hour"], listed[mine]["currency"]) == (2.88, "CNY")
    assert listed[other]["host"] is None and listed[other]["unknown_billing"] is True
    assert (listed[other]["label"], listed[other]["gpu"], listed[other]["price_per_hour"]) == \
        ("forgotten", "2x H800-80G", 17.76)
    assert listed[other]["created_at"] is not None
    assert not [i for i in account["instances"] if i["state"] == "released"]  # d1 was released above
    orch("down", "d4")
    orch("release", "d4", "--yes")
    api_call(autodl, "power_off", {"instance_uuid": other})
    wait_until(lambda: autodl.boxes[other].status == "shutdown", what="the other instance off", timeout=60)
    api_call(autodl, "release", {"instance_uuid": other})
    assert autodl.billing() == []


def test_the_stand_in_refuses_what_autodl_would_so_orch_cannot_pass_by_sending_it(autodl: AutoDLStandin) -> None:
    def call(method: str, path: str, body: dict[str, Any] | None, token: str = autodl.token) -> tuple[int, Any]:
        req = urllib.request.Request(f"{autodl.url}{path}", method=method, headers={"Authorization": token},
                                     data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(req, timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    create = {"req_gpu_amount": 1, "expand_system_disk_by_gb": 0, "gpu_spec_uuid": "4090D",
              "image_uuid": "base-image-l2t43iu6uk", "cuda_v_from": 118}
    before = len(autodl.boxes)
    for body, words in [({k: v for k, v in create.items() if k != "cuda_v_from"}, "cuda_v_from is required"),
                        ({**create, "disk": 40}, "unknown field disk"),
                        ({**create, "req_gpu_amount": "1"}, "req_gpu_amount has the wrong type"),
                        ({**create, "req_gpu_amount": 5}, "req_gpu_amount 1-4"),
                        ({**create, "gpu_spec_uuid": "RTX 4090"}, "算力规格 RTX 4090 不存在"),
                        ({**create, "data_center_list": ["moon"]}, "data_center_list")]:
        status, answer = call("POST", "/api/v1/dev/instance/pro/create", body)
        assert status == 200 and answer["code"] == "InvalidParams" and words in answer["msg"], answer
        assert answer["request_id"] and answer["data"] is None
    assert len(autodl.boxes) == before
    assert call("POST", "/api/v1/dev/instance/pro/status", {"instance_uuid": "x"}) == (404, "404 page not found")
    assert call("GET", "/api/v1/dev/wallet/balance", None) == (404, "404 page not found")
    status, refused = call("POST", "/api/v1/dev/wallet/balance", {}, token="Bearer " + autodl.token)
    assert status == 401 and refused["code"] == "AuthorizeFailed" and refused["request_id"]
    status, wallet = call("POST", "/api/v1/dev/wallet/balance", {})
    assert status == 200 and set(wallet["data"]) == {"assets", "accumulate", "voucher_balance"}

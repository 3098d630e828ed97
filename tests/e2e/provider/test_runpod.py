"""RunPod on REST v2 through the CLI against its stand-in (real HTTP, real sshd pods), beyond what
test_rent.py runs on both marketplaces: a create that answers HTTP 500 after making the pod is
found by its name and used (so `orch release` removes it and nothing is left billing), and a pod
whose container fails while starting (``ERROR``) ends `orch up` with RunPod's word."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from tests.support.orch import Orch
from tests.support.standin.runpod import RunPodStandin

KEY = "ORCH_TEST_RUNPOD_KEY"


def admin(standin: RunPodStandin, action: str, args: dict[str, Any]) -> None:
    req = urllib.request.Request(f"{standin.url}/standin/{action}", data=json.dumps(args).encode(), method="POST")
    urllib.request.urlopen(req, timeout=10).read()


def rent(orch: Orch, runpod: RunPodStandin, name: str, **kw: Any) -> Any:
    orch.env[KEY] = runpod.token
    return orch("rent", name, "--provider", "runpod", "--gpu", "RTX 4090", "--token-env", KEY, "--api-url",
                runpod.url, "--python", "/usr/bin/python3", "--user", runpod.next_user(), "--root", "~/orch",
                "--yes", **kw)


def test_a_create_answered_500_after_making_the_pod_finds_it_by_name_and_release_leaves_nothing_billing(
        orch: Orch, runpod: RunPodStandin) -> None:
    admin(runpod, "create_fault", {"status": 500})
    before = len(runpod.calls)
    rented = rent(orch, runpod, "r5")
    (made,) = [p for p, body in runpod.pods.items() if body["name"] == "orch-r5"]
    assert [c for c in runpod.calls[before:] if c == "POST /v2/pods"] == ["POST /v2/pods"]  # sent once
    assert f"rented runpod instance {made} at 0.34 USD/h" in rented.stderr
    assert json.loads((orch.home / "hosts" / "r5.json").read_text())["provider"]["instance"] == made
    assert orch("exec", "r5", "--", "whoami").stdout.strip() == runpod.boxes[made].user
    gone = orch("release", "r5", "--yes")
    assert f"runpod instance {made} released" in gone.stderr and runpod.billing() == []
    billed = runpod.ledger()
    time.sleep(0.5)
    assert runpod.ledger() == billed  # nothing left billing


def test_a_pod_whose_container_fails_while_starting_ends_orch_up_with_runpods_word(
        orch: Orch, runpod: RunPodStandin) -> None:
    rent(orch, runpod, "r6")
    (pod,) = [p for p, body in runpod.pods.items() if body["name"] == "orch-r6"]
    orch("down", "r6")
    admin(runpod, "fail_boots", {"count": 1})
    failed = orch("up", "r6", env={"ORCH_UP_TIMEOUT_S": "300"}, check=4)
    assert f"instance {pod} failed while starting (ERROR)" in failed.stderr
    assert "orch release r6" in failed.stderr and "SSH did not answer" not in failed.stderr
    assert runpod.boxes[pod].status == "ERROR"
    orch("up", "r6")  # RunPod starts an ERROR pod again ([S] podAction: start from EXITED or ERROR)
    assert orch("exec", "r6", "--", "whoami").stdout.strip() == runpod.boxes[pod].user
    orch("release", "r6", "--yes")
    assert runpod.billing() == []

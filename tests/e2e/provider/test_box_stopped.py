"""A follow or watch whose provider box is powered off stops, and status stops counting its cost
(issue 37 item 5), through the CLI against the AutoDL stand-in: the box powers itself off under
a running job while `orch logs -f` and `orch fetch --watch` run in other processes; both end
within their reconnect cycle with AutoDL's words and the way on (exit 1: the job did not
succeed), and `orch status --json`'s COST and ELAPSED stop growing — also once the box is on
again and the job shows lost; and `orch submit --follow` of a vast instance destroyed elsewhere
ends saying its files went with it — or, where `orch fetch --watch` kept a copy, that
`orch resume JOB --on OTHER_HOST` continues it from there."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from orchestrator.providers.vast import Vast
from tests.e2e.provider.test_autodl import TOKEN_ENV, add, admin
from tests.e2e.provider.test_vast import instance_of, rent
from tests.support.orch import TICKER, Orch, write_job
from tests.support.poll import wait_until
from tests.support.standin.autodl import AutoDLStandin
from tests.support.standin.vast import VastStandin


def background(orch: Orch, out: Path, *args: str) -> subprocess.Popen[str]:
    """``orch ARGS`` in another process, stdout and stderr into ``out``."""
    return subprocess.Popen([sys.executable, "-m", "orchestrator", *args], cwd=orch.cwd, env=orch.env,
                            stdout=out.open("w"), stderr=subprocess.STDOUT, text=True)


def test_a_follow_and_a_watch_stop_with_a_powered_off_box_and_status_stops_counting_its_cost(
        orch: Orch, autodl: AutoDLStandin) -> None:
    orch.env[TOKEN_ENV] = autodl.token
    uuid = add(orch, autodl, "off1", 0)
    box = autodl.boxes[uuid]
    orch("up", "off1", "--trust")  # keeps AutoDL's price in the entry: COST is counted
    spec = write_job(orch.cwd, "stopped", "off1", ["python", "tick.py"])
    (orch.cwd / "ws" / "tick.py").write_text(TICKER)
    job = orch.json("submit", str(spec))["job_id"]
    assert orch.wait_state(job, ("running",))["state"] == "running"

    followed, watched = orch.cwd / "follow.txt", orch.cwd / "watch.txt"
    follow = background(orch, followed, "logs", job, "-f")
    watch = background(orch, watched, "fetch", job, "--watch", "--interval", "0.5")
    wait_until(lambda: "tick 1" in followed.read_text(), what="the follow to stream the log", timeout=120,
               interval=0.3)
    wait_until(lambda: f"watching {job}" in watched.read_text(), what="the watch to start", timeout=120,
               interval=0.3)

    admin(autodl, "inside_shutdown", instance_uuid=uuid)  # the box powers off under the job
    wait_until(lambda: box.status == "shutdown", what="AutoDL to say the box is off", timeout=60, interval=0.3)
    words = f"off1: autodl says the instance {uuid} is shutdown (powered off): {job} stopped with it; " \
            f"orch up off1, then orch resume {job}"
    assert follow.wait(timeout=180) == 1, followed.read_text()
    assert f"error: {words}" in followed.read_text() and "Traceback" not in followed.read_text()
    assert watch.wait(timeout=180) == 1, watched.read_text()
    assert f"error: {words}" in watched.read_text() and "Traceback" not in watched.read_text()

    first = orch.json("status", job)
    assert first["reason"] == words and first["stale"] is True, first
    assert box.stopped_at is not None  # the cost ends at AutoDL's stopped_at (whole seconds on the wire)
    assert abs(first["box_stopped_at"] - box.stopped_at.timestamp()) < 1.0, first
    assert first["progress"]["cost"] is not None and first["progress"]["cost"] > 0
    time.sleep(2.0)  # a running job's cost would have grown meanwhile
    second = orch.json("status", job)
    assert second["progress"]["cost"] == first["progress"]["cost"]
    assert second["progress"]["elapsed_s"] == first["progress"]["elapsed_s"]
    [listed] = [j for j in orch.json("status") if j["job_id"] == job]
    assert listed["progress"]["cost"] == first["progress"]["cost"]

    orch("up", "off1")  # the box is back; the job's supervisor went with the power-off
    lost = orch.json("status", job)
    assert lost["state"] == "lost", lost
    assert lost["progress"]["cost"] == first["progress"]["cost"]
    spent = next(r for r in orch.json("spend")["hosts"] if r["host"] == "off1")
    assert abs(spent["cost"] - first["progress"]["cost"]) < 1e-6
    orch("down", "off1")


def test_submit_follow_stops_when_the_instance_is_released_elsewhere_and_says_no_copy_was_kept(
        orch: Orch, vast: VastStandin) -> None:
    _, user = rent(orch, vast, "gone1")
    instance = instance_of(vast, user)
    spec = write_job(orch.cwd, "released", "gone1", ["python", "tick.py"])
    (orch.cwd / "ws" / "tick.py").write_text(TICKER)
    out = orch.cwd / "submit.txt"
    submit = background(orch, out, "submit", str(spec), "--follow")
    wait_until(lambda: "tick 1" in out.read_text(), what="the follow to stream the log", timeout=120, interval=0.3)
    [job] = [j["job_id"] for j in orch.json("status") if j["hosts"] == ["gone1"]]

    Vast(vast.token, vast.url).release(instance)  # destroyed in vast's console, say: the box and its disk are gone
    assert submit.wait(timeout=180) == 1, out.read_text()
    words = (f"gone1: vast says the instance {instance} is destroyed (released): {job}'s files on it are gone and "
             "no copy was kept here (orch fetch --watch keeps one); submit its job file again on another host")
    assert f"error: {words}" in out.read_text() and "Traceback" not in out.read_text()
    assert orch.json("status", job)["reason"] == words


def test_a_follow_and_a_watch_of_a_released_instance_name_the_copy_the_watch_kept_for_a_move(
        orch: Orch, vast: VastStandin) -> None:
    _, user = rent(orch, vast, "gone2")
    instance = instance_of(vast, user)
    spec = write_job(orch.cwd, "kept", "gone2", ["python", "tick.py"])
    (orch.cwd / "ws" / "tick.py").write_text(TICKER)
    job = orch.json("submit", str(spec))["job_id"]
    followed, watched = orch.cwd / "follow2.txt", orch.cwd / "watch2.txt"
    watch = background(orch, watched, "fetch", job, "--watch", "--interval", "0.5")
    kit = orch.cwd / "runs" / job
    wait_until(lambda: (kit / ".orch-job" / "move.json").is_file(), what="the watch to keep the move kit",
               timeout=120, interval=0.3)
    follow = background(orch, followed, "logs", job, "-f")
    wait_until(lambda: "tick 1" in followed.read_text(), what="the follow to stream the log", timeout=120,
               interval=0.3)

    Vast(vast.token, vast.url).release(instance)
    words = (f"gone2: vast says the instance {instance} is destroyed (released): {job}'s files on it are gone; "
             f"orch resume {job} --on OTHER_HOST continues it from the copy orch fetch --watch kept in "
             f"{kit.resolve()}")
    for proc, out in ((follow, followed), (watch, watched)):
        assert proc.wait(timeout=180) == 1, out.read_text()
        assert f"error: {words}" in out.read_text() and "Traceback" not in out.read_text()

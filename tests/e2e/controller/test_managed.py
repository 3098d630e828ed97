"""Managed jobs (issue 40 item 2) through the CLI: a job on a host whose network and processes
die mid-run ends succeeded on the recovery host with no command typed after the submit,
bit-identical to an uninterrupted run; a job whose script fails is not restarted;
``max_restarts`` is honoured. The controller runs on ``local``; the job hosts are the loopback
sshd, one of them behind the fault proxy."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import torch

from tests.e2e.controller.conftest import FAST, controller_home, managed, wait_done
from tests.support.moves import adapter, steps_logged, trainer_spec
from tests.support.orch import TICKER, Orch, write_job
from tests.support.poll import wait_until
from tests.support.proxy import FaultProxy
from tests.support.webhooks import Hook, hook  # noqa: F401 - the fixture


def with_recovery(spec: Path, recovery: dict) -> Path:
    data = json.loads(spec.read_text())
    data["recovery"] = recovery
    spec.write_text(json.dumps(data))
    return spec


def kill_box(orch: Orch, proxy: FaultProxy, job: str) -> None:
    """The box is gone: unreachable, its processes killed, its job folder removed."""
    server_dir = orch.remote_root / "jobs" / job
    status = json.loads((server_dir / "status.json").read_text())
    proxy.close()
    os.kill(status["supervisor_pid"], signal.SIGKILL)
    os.killpg(status["pgid"], signal.SIGKILL)
    shutil.rmtree(server_dir)


def test_a_managed_job_whose_box_dies_ends_succeeded_on_the_recovery_host(
        orch: Orch, flaky: str, proxy: FaultProxy, box2: str, tiny_assets: Path, controllers: list[str]) -> None:
    ref = json.loads(orch("submit", str(trainer_spec(orch, tiny_assets, "local", "ref")), "--follow", "--json",
                          timeout=600).stdout)
    assert ref["state"] == "succeeded"
    controllers.append("local")
    orch("controller", "up", "local", env=FAST)
    spec = with_recovery(trainer_spec(orch, tiny_assets, flaky, "mg", delay=0.6), {"hosts": [box2], "max_restarts": 2})
    out = orch("submit", str(spec), "--json")
    job = json.loads(out.stdout)["job_id"]
    assert f"{job} is managed by the controller on local" in out.stderr
    kit = controller_home(orch) / "runs" / job / ".orch-job" / "move.json"

    def kit_checkpoint() -> str | None:
        try:
            return json.loads(kit.read_text()).get("checkpoint")
        except (OSError, ValueError):
            return None

    wait_until(kit_checkpoint, what="a checkpoint kept on the controller", timeout=300)
    kill_box(orch, proxy, job)  # no command is typed after this

    done = wait_done(orch, job, timeout=600)
    assert done["state"] == "succeeded" and done["hosts"] == ["box2"] and done["recoveries"] == 1, done
    assert done["history"][0]["from"] == ["flaky"] and "unreachable" in done["history"][0]["why"]
    logs = orch("controller", "logs").stdout
    assert f"{job}: recovered on box2" in logs and f"{job}: succeeded" in logs

    run = controller_home(orch) / "runs" / job  # the outputs, fetched by the controller at the end
    orch("fetch", ref["job_id"])
    a, b = adapter(orch.cwd / "runs" / ref["job_id"]), adapter(run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert steps_logged(run) == list(range(1, 13))  # metrics continuous across the move: each step once

    # the laptop sees it: where it runs now and how often it was recovered; fetch from there
    status = orch.json("status", job)
    assert status["state"] == "succeeded" and status["hosts"] == ["box2"], status
    assert status["managed"]["recoveries"] == 1 and status["managed"]["controller"] == "local"
    assert f"{job}: managed by the controller on local: on box2, recovered 1x" in orch("status").stdout
    orch("fetch", job)
    here = adapter(orch.cwd / "runs" / job)
    assert all(torch.equal(a[k], here[k]) for k in a)


def test_a_managed_job_whose_script_fails_is_not_restarted(orch: Orch, box: str, box2: str,
                                                           controllers: list[str]) -> None:
    controllers.append("local")
    orch("controller", "up", "local", env=FAST)
    spec = write_job(orch.cwd, "boom", box, ["python", "boom.py"], extra="recovery: {hosts: [box2]}\n")
    (orch.cwd / "ws" / "boom.py").write_text("import sys\nprint('boom', flush=True)\nsys.exit(3)\n")
    job = json.loads(orch("submit", str(spec), "--json").stdout)["job_id"]
    done = wait_done(orch, job, timeout=300)
    assert done["state"] == "failed" and done["recoveries"] == 0 and done["hosts"] == ["box"], done
    assert "the script failed (exit 3): not restarted" in done["note"]
    assert not (orch.remote_root / "box2" / "jobs" / job).exists()


def test_a_managed_job_refuses_to_start_without_a_controller_or_on_local(orch: Orch, box: str,
                                                                        controllers: list[str]) -> None:
    spec = write_job(orch.cwd, "nope", box, ["python", "x.py"], extra="recovery: {hosts: [local]}\n")
    (orch.cwd / "ws" / "x.py").write_text("print(1)\n")
    none = orch("submit", str(spec), check=2)
    assert "needs a controller: start one with `orch controller up HOST`" in none.stderr
    bad = orch.cwd / "bad.yaml"
    bad.write_text(spec.read_text().replace("recovery: {hosts: [local]}", "recovery: {hosts: [b], max_restarts: x}"))
    wrong = orch("submit", str(bad), check=2)
    assert "bad.yaml:7:38: recovery.max_restarts: must be an integer" in wrong.stderr
    controllers.append("local")
    orch("controller", "up", "local")
    here = orch("submit", str(spec), check=2)
    assert "`local` is this laptop's" in here.stderr
    assert orch.json("status") == []  # nothing started


def test_a_controller_killed_during_a_recovery_finishes_it_once_when_started_again(
        orch: Orch, flaky: str, proxy: FaultProxy, box2: str, tiny_assets: Path, controllers: list[str],
        tmp_path: Path) -> None:
    controllers.append("local")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    orch("controller", "up", "local", env={**FAST, "ORCH_TEST_PAUSE": f"move-adopted:{hooks}"})
    spec = with_recovery(trainer_spec(orch, tiny_assets, flaky, "kc", delay=0.6), {"hosts": [box2]})
    job = json.loads(orch("submit", str(spec), "--json").stdout)["job_id"]
    kit = controller_home(orch) / "runs" / job / ".orch-job" / "move.json"
    wait_until(lambda: kit.is_file() and json.loads(kit.read_text()).get("checkpoint"),
               what="a checkpoint kept on the controller", timeout=300)
    kill_box(orch, proxy, job)
    wait_until(lambda: (hooks / "move-adopted.reached").exists(), what="the recovery's adoption on box2",
               timeout=300, detail=lambda: orch("controller", "logs", check=None).stdout)
    killed = orch.json("controller", "status")["pid"]
    os.kill(killed, signal.SIGKILL)  # the job started on box2; the controller's registry was not yet told

    orch("controller", "up", "local", env=FAST)  # started again (no pause this time)
    done = wait_done(orch, job, timeout=600)
    assert done["state"] == "succeeded" and done["hosts"] == ["box2"] and done["recoveries"] == 1, done
    assert len(done["history"]) == 1
    folder = orch.remote_root / "box2" / "jobs" / job
    starts = (folder / "logs" / "node0.log").read_text().count("[orch] starting:")
    assert starts == 2 and json.loads((folder / "status.json").read_text())["attempt"] == 2  # flaky's, then box2's once
    assert steps_logged(controller_home(orch) / "runs" / job) == list(range(1, 13))


def test_a_managed_job_lost_more_often_than_max_restarts_stays_lost(
        orch: Orch, flaky: str, proxy: FaultProxy, box2: str, controllers: list[str]) -> None:
    controllers.append("local")
    orch("controller", "up", "local", env=FAST)
    spec = write_job(orch.cwd, "tick", flaky, ["python", "tick.py"],
                     extra="recovery: {hosts: [box2], max_restarts: 0}\n")
    (orch.cwd / "ws" / "tick.py").write_text(TICKER)
    job = json.loads(orch("submit", str(spec), "--json").stdout)["job_id"]
    orch.wait_state(job, ("running",))
    wait_until(lambda: managed(orch, job).get("checked_at"), what="a first check", timeout=120)
    kill_box(orch, proxy, job)
    done = wait_done(orch, job, timeout=300)
    assert done["state"] == "lost" and done["recoveries"] == 0 and done["hosts"] == ["flaky"], done
    assert "max_restarts (0) reached: not recovered" in done["note"]
    assert not (orch.remote_root / "box2" / "jobs" / job).exists()

    fetched = orch("fetch", job)  # the box is gone: the controller's copy
    assert "from the controller's copy" in fetched.stdout, fetched
    assert len(list((orch.cwd / "runs" / job / "outputs").glob("attempt-1-*"))) == 1
    assert "tick 1" in (orch.cwd / "runs" / job / "logs" / "node0.log").read_text()


def test_a_managed_job_whose_supervisor_dies_is_restarted_where_it_ran_and_orch_cancel_ends_its_management(
        orch: Orch, box: str, controllers: list[str], hook: Hook) -> None:
    controllers.append("local")
    orch("controller", "up", "local", env=FAST)
    spec = write_job(orch.cwd, "tick", box, ["python", "tick.py"],
                     extra=f"on_finish: {{notify: {{url: '{hook.url()}', format: json}}}}\n")
    (orch.cwd / "ws" / "tick.py").write_text(TICKER)
    job = json.loads(orch("submit", str(spec), "--managed", "--json").stdout)["job_id"]
    orch.wait_state(job, ("running",))
    folder = orch.remote_root / "jobs" / job
    wait_until(lambda: managed(orch, job).get("checked_at"), what="a first check", timeout=120)
    status = json.loads((folder / "status.json").read_text())
    os.kill(status["supervisor_pid"], signal.SIGKILL)  # the box rebooted: no process left, no end written
    os.killpg(status["pgid"], signal.SIGKILL)
    wait_until(lambda: managed(orch, job).get("recoveries") == 1 and managed(orch, job)["phase"] == "watching",
               what="the restart", timeout=300, detail=lambda: orch("controller", "logs", check=None).stdout)
    assert "supervisor on box is gone" in managed(orch, job)["history"][0]["why"]
    told = [r["body"] for r in hook.requests if r["body"].get("event") == "managed"]  # the recovery's webhook call
    assert len(told) == 1 and told[0]["text"].startswith(f"orch: {job} recovered: moved from box to box"), told
    orch.wait_state(job, ("running",))
    assert f"{job}: managed by the controller on local: on box, recovered 1x" in orch("status").stdout

    out = orch("cancel", job)
    assert f"{job}: no longer managed" in out.stderr and f"{job}: cancelled" in out.stdout
    done = managed(orch, job)
    assert done["phase"] == "done" and "cancelled with orch cancel" in done["note"]
    assert len(list((folder / "outputs").glob("attempt-*"))) == 2  # the first, then one restart


def test_a_managed_job_moves_to_a_rented_replacement_which_is_released_at_the_end(
        orch: Orch, flaky: str, proxy: FaultProxy, vast, controllers: list[str]) -> None:
    orch.env["ORCH_TEST_VAST_KEY"] = vast.token
    controllers.append("local")
    orch("controller", "up", "local", env=FAST)
    rent = {"provider": "vast", "gpu": "RTX_4090", "max_price": 0.5, "token_env": "ORCH_TEST_VAST_KEY",
            "api_url": vast.url, "user": vast.next_user(), "root": "~/orch", "python": "/usr/bin/python3"}
    spec = write_job(orch.cwd, "rt", flaky, ["python", "tick.py", "60"],
                     extra="recovery: " + json.dumps({"rent": rent, "max_restarts": 1}) + "\n")
    (orch.cwd / "ws" / "tick.py").write_text(TICKER)
    before = set(vast.boxes)
    job = json.loads(orch("submit", str(spec), "--json").stdout)["job_id"]
    kit = controller_home(orch) / "runs" / job / ".orch-job" / "move.json"
    wait_until(kit.is_file, what="the job's copy on the controller", timeout=120)
    kill_box(orch, proxy, job)

    done = wait_done(orch, job, timeout=600)
    (instance,) = set(vast.boxes) - before
    assert done["state"] == "succeeded" and done["recoveries"] == 1, done
    assert done["hosts"] == [f"rent-{job.rsplit('-', 1)[-1]}-1"]
    logs = orch("controller", "logs").stdout
    assert f"rented vast instance {instance}" in logs and f"released {done['hosts'][0]} (vast instance {instance})" in logs
    assert vast.billing() == []  # nothing left billing
    assert vast.token not in logs
    assert [p for p in controller_home(orch).rglob("*") if p.is_file() and vast.token.encode() in p.read_bytes()] == []


def test_the_old_box_coming_back_after_a_recovery_finds_its_attempt_fenced(
        orch: Orch, flaky: str, proxy: FaultProxy, box2: str, controllers: list[str]) -> None:
    controllers.append("local")
    orch("controller", "up", "local", env=FAST)
    spec = write_job(orch.cwd, "fence", flaky, ["python", "tick.py"], extra="recovery: {hosts: [box2]}\n")
    (orch.cwd / "ws" / "tick.py").write_text(TICKER)
    job = json.loads(orch("submit", str(spec), "--json").stdout)["job_id"]
    orch.wait_state(job, ("running",))
    kit = controller_home(orch) / "runs" / job / ".orch-job" / "move.json"
    wait_until(kit.is_file, what="the job's copy on the controller", timeout=120)
    old = json.loads((orch.remote_root / "jobs" / job / "status.json").read_text())
    proxy.close()  # only the network: the old attempt runs on, cut off
    wait_until(lambda: managed(orch, job).get("hosts") == ["box2"], what="the recovery to box2", timeout=300,
               detail=lambda: orch("controller", "logs", check=None).stdout)
    assert Path(f"/proc/{old['supervisor_pid']}").exists()  # two attempts now, one of them unreachable

    proxy.reopen()  # the old box comes back: the controller's next contact stops its attempt
    aside = orch.remote_root / "jobs" / ".superseded"
    wait_until(lambda: list(aside.glob(f"{job}-*")), what="the old attempt set aside", timeout=300,
               detail=lambda: orch("controller", "logs", check=None).stdout)
    wait_until(lambda: not Path(f"/proc/{old['supervisor_pid']}").exists() or Path(
        f"/proc/{old['supervisor_pid']}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z",
        what="the old supervisor stopped", timeout=120)
    assert not (orch.remote_root / "jobs" / job).exists()
    assert json.loads((orch.remote_root / "box2" / "jobs" / job / "status.json").read_text())["state"] in (
        "pending", "running")  # the one live attempt
    orch("cancel", job)

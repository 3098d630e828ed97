"""The warm server failing under its commands (orchestrator/warm/): killed (SIGKILL), stopped
(SIGSTOP), its code edited on disk — and the caller's environment (TZ) in what it runs. Each
runs through the CLI with a real server, on a copy of orch's source (``own_source``: edits by
others in the checkout never make these servers stale midway, and the edit test edits the copy)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tests.orchestrator.warm.test_warm import SLEEPY, alive, forked_by, printing_job, ready
from tests.support.orch import REPO, Orch, write_job
from tests.support.poll import wait_until


def own_source(tmp_path: Path) -> Path:
    """A copy of orch's packages to run from (``PYTHONPATH``)."""
    src = tmp_path / "src"
    for package in ("orchestrator", "remote_payload"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    return src


def warm_env(orch: Orch, tmp_path: Path, src: Path | None = None, **extra: str) -> tuple[dict[str, str], Path]:
    """orch's environment on ``src`` (a fresh copy by default) with a trace file; its server started."""
    trace = tmp_path / "trace.txt"
    env = {**orch.env, "PYTHONPATH": str(src or own_source(tmp_path)), "ORCH_TRACE": str(trace), **extra}
    orch("status", env=env)
    ready(env)
    return env, trace


def client(orch: Orch, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "orchestrator", *args], cwd=orch.cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def started(trace: Path, seen: int) -> int:
    """The pid of the next command a warm server started, after the ``seen`` ones."""
    return wait_until(lambda: forked_by(trace, seen), what="the command to start on the warm server",
                      timeout=120)[-1][0]


def in_epoll_wait(pid: int) -> bool:
    """The client waits in its selector (for the server's answer): its handlers are in place."""
    try:
        return "epoll" in Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return False


def test_a_killed_server_takes_its_command_down_with_the_client_and_a_killed_client_without_the_server(
        orch: Orch, tmp_path: Path) -> None:
    env, trace = warm_env(orch, tmp_path)
    job = printing_job(orch, env)

    # the server killed while `logs -f` follows: the command is stopped as Ctrl-C stops it, and
    # the client ends once it ended, saying so
    seen = len(forked_by(trace))
    follower = client(orch, env, "logs", job, "-f")
    command = started(trace, seen)
    server = ready(env)
    os.kill(server, signal.SIGKILL)
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 130, (out, err)
    assert "lost the warm server that ran this command" in err and "stopped following" in err, err
    assert not alive(command)

    # client and server both killed (the client stopped first, so only the command can act): the
    # command sees its client gone and kills itself, with no server to do it
    orch("status", env=env)
    server = ready(env)
    seen = len(forked_by(trace))
    follower = client(orch, env, "logs", job, "-f")
    command = started(trace, seen)
    follower.send_signal(signal.SIGSTOP)
    try:
        os.kill(server, signal.SIGKILL)
        wait_until(lambda: not alive(server), what="the server to die", timeout=30)
        assert alive(command)
    finally:
        follower.kill()
        follower.communicate(timeout=60)
    wait_until(lambda: not alive(command), what="the orphaned command to end", timeout=30)
    orch("cancel", job, env=env)


def test_a_submit_whose_server_is_killed_after_its_sync_starts_nothing_and_the_rerun_starts_the_job_once(
        orch: Orch, box: str, tmp_path: Path) -> None:
    """What a user does after the server died under a submit is to run it again: one job."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    env, trace = warm_env(orch, tmp_path, ORCH_TEST_PAUSE=f"after-sync:{hooks}")
    spec = write_job(orch.cwd, "once", box, ["python", "-c", "print('ran once')"])
    seen = len(forked_by(trace))
    submit = client(orch, env, "submit", str(spec))
    command = started(trace, seen)
    wait_until(lambda: (hooks / "after-sync.reached").exists() or submit.poll() is not None,
               what="the submit to pause after its sync", timeout=120)
    assert submit.poll() is None, submit.communicate()
    os.kill(ready(env), signal.SIGKILL)
    out, err = submit.communicate(timeout=120)
    assert submit.returncode == 130 and "lost the warm server" in err, (out, err)
    assert not alive(command)

    rerun = orch("submit", str(spec), "--json", env={**env, "ORCH_TEST_PAUSE": ""})
    job = json.loads(rerun.stdout)["job_id"]
    assert orch.wait_state(job, ("succeeded", "failed"), timeout=180)["state"] == "succeeded"
    ids = [j["job_id"] for j in orch.json("status", env=env) if j["job_id"].startswith("once-")]
    assert ids == [job], ids
    assert sorted(p.name for p in (orch.remote_root / "jobs").glob("once-*")) == [job]


def jobs_of(listing: str) -> list[tuple[str, str]]:
    return [(j["job_id"], j["state"]) for j in json.loads(listing)]


def test_a_stopped_server_is_bypassed_and_ctrl_c_and_sigterm_work_at_once(orch: Orch, tmp_path: Path) -> None:
    env, trace = warm_env(orch, tmp_path)
    job = orch.json("submit", str(write_job(orch.cwd, "sleepy", "local", SLEEPY)), env=env)["job_id"]
    server = ready(env)
    cold = orch("status", "--json", env={**env, "ORCH_WARM": "0"})
    seen = len(forked_by(trace))
    os.kill(server, signal.SIGSTOP)
    try:
        bypassed = orch("status", "--json", env=env)  # after the bound, in its own process
        assert jobs_of(bypassed.stdout) == jobs_of(cold.stdout) == [(job, "running")]
        assert bypassed.stderr.count("\n") == 1 and "warm server did not answer" in bypassed.stderr
        for signum in (signal.SIGINT, signal.SIGTERM):  # before the bound: at once, as the signal ends orch
            waiting = client(orch, env, "status")
            wait_until(lambda: in_epoll_wait(waiting.pid), what="the client to wait for the server", timeout=60)
            waiting.send_signal(signum)
            out, err = waiting.communicate(timeout=60)
            assert waiting.returncode == -signum and "did not answer" not in err, (out, err)
    finally:
        os.kill(server, signal.SIGCONT)
    orch("status", env=env)  # the server, continued, answers again; what the clients left ran nowhere
    assert forked_by(trace, seen) and len(forked_by(trace, seen)) == 1

    # stopped while a command runs: the command's own word ends its client, no server needed
    follower = client(orch, env, "logs", job, "-f")
    command = started(trace, seen + 1)
    os.kill(server, signal.SIGSTOP)
    try:
        follower.send_signal(signal.SIGINT)
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 130 and "stopped following" in err, (out, err)
        wait_until(lambda: not alive(command), what="the command to end", timeout=30)
    finally:
        os.kill(server, signal.SIGCONT)
    orch("cancel", job, env=env)


def test_a_server_whose_loaded_code_or_distribution_changed_runs_nothing_more(orch: Orch, tmp_path: Path) -> None:
    """Any module the server loaded — here the shipped protocol the laptop speaks, outside
    ``orchestrator/`` — and the installed distribution's metadata (its version)."""
    src = own_source(tmp_path)
    dist = src / "orch_gpu-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: orch-gpu\nVersion: 0.1.0\n")
    (dist / "top_level.txt").write_text("orchestrator\nremote_payload\n")
    env, trace = warm_env(orch, tmp_path, src)
    cold = orch("status", env={**env, "ORCH_WARM": "0"}).stdout

    for edit in (lambda: _append(src / "remote_payload" / "contract" / "protocol.py", "\n# edited\n"),
                 lambda: (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: orch-gpu\nVersion: 0.2.0\n")):
        old = ready(env)
        orch("status", env=env)
        assert forked_by(trace)[-1][1] == old  # it ran that one
        before = len(forked_by(trace))
        edit()
        assert orch("status", env=env).stdout == cold
        assert len(forked_by(trace)) == before  # the stale server ran nothing
        wait_until(lambda: not alive(old), what="the stale server to end", timeout=60)
        assert ready(env) != old


def _append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def test_a_command_on_the_warm_server_keeps_its_callers_time_zone(orch: Orch, tmp_path: Path) -> None:
    """The job id holds the submit's local time: in the caller's zone, not the server's."""
    env, trace = warm_env(orch, tmp_path, TZ="UTC0")  # the server's own zone
    zone = timezone(timedelta(hours=14))
    spec = write_job(orch.cwd, "zoned", "local", ["python", "-c", "print('hi')"])
    seen = len(forked_by(trace))
    before = datetime.now(zone).replace(microsecond=0, tzinfo=None)
    job = orch.json("submit", str(spec), env={**env, "TZ": "ORCHTEST-14"})["job_id"]
    after = datetime.now(zone).replace(tzinfo=None)
    assert forked_by(trace, seen)  # on the warm server
    stamp = re.fullmatch(r"zoned-(\d{8}-\d{6})-[0-9a-f]{4}", job)
    assert stamp, job
    assert before <= datetime.strptime(stamp.group(1), "%Y%m%d-%H%M%S") <= after, (before, job, after)

"""A word on the laptop when a job ends (issue 15): with --notify (or ORCH_NOTIFY=1), `submit
--follow`, `logs -f`, `fetch --watch` and `status -w` ring the bell on a terminal and call the
desktop notifier (here a recording `notify-send` first on PATH) when they see a job end;
without it, nothing; a job that had ended before is not news."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from orchestrator.display import notify
from tests.support.orch import Orch, write_job

SLEEPER = ["python", "-c", "import time; print('working', flush=True); time.sleep(3); print('done')"]


def calls(path: Path) -> list[list[str]]:
    return [line.split("\t")[:-1] for line in path.read_text().splitlines()] if path.exists() else []


def with_path(bin_dir: Path, **extra: str) -> dict[str, str]:
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **extra}


def test_submit_follow_notify_calls_the_desktop_notifier(orch: Orch, host: str, desktop: tuple[Path, Path]) -> None:
    bin_dir, recorded = desktop
    spec = write_job(orch.cwd, "quick", host, ["python", "-c", "raise SystemExit(2)"])
    out = orch("submit", str(spec), "--follow", "--notify", "--json", env=with_path(bin_dir), check=1)
    job_id = json.loads(out.stdout)["job_id"]
    (call,) = calls(recorded)
    assert call[:2] == ["--app-name=orch", f"orch: {job_id}"] and call[2].startswith("failed: ")
    orch("submit", str(spec), "--follow", "--json", env=with_path(bin_dir), check=1)  # no --notify: no word
    assert len(calls(recorded)) == 1


def test_orch_notify_makes_it_the_default_for_logs_and_fetch_watch(orch: Orch, desktop: tuple[Path, Path]) -> None:
    bin_dir, recorded = desktop
    job_id = json.loads(orch("submit", str(write_job(orch.cwd, "sleepy", "local", SLEEPER)), "--json").stdout)["job_id"]
    orch("logs", job_id, "-f", env=with_path(bin_dir, ORCH_NOTIFY="1"))
    orch("fetch", job_id, "--watch", "--interval", "0.3", "--notify", env=with_path(bin_dir))
    assert [c[1:] for c in calls(recorded)] == [[f"orch: {job_id}", "succeeded"]] * 2


def test_status_watch_says_when_a_job_it_saw_running_ends(orch: Orch, desktop: tuple[Path, Path]) -> None:
    bin_dir, recorded = desktop
    done = json.loads(orch("submit", str(write_job(orch.cwd, "early", "local", ["true"])), "--follow", "--json").stdout)
    job_id = json.loads(orch("submit", str(write_job(orch.cwd, "sleepy", "local", SLEEPER)), "--json").stdout)["job_id"]
    orch.wait_state(job_id, ("running",))
    orch("status", "-w", "--notify", "--interval", "0.3", "--iterations", "60", env=with_path(bin_dir), timeout=120)
    assert [c[1] for c in calls(recorded)] == [f"orch: {job_id}"]  # not the job that had ended before
    assert done["job_id"] != job_id


def test_the_bell_rings_only_on_a_terminal(orch: Orch, tmp_path: Path) -> None:
    job_id = json.loads(orch("submit", str(write_job(orch.cwd, "sleepy", "local", SLEEPER)), "--json").stdout)["job_id"]
    env = {**orch.env, "PATH": "/usr/bin:/bin"}  # no notify-send: the bell alone
    master, slave = pty.openpty()
    err = bytearray()

    def drain() -> None:  # a terminal's buffer is small: read it while the command runs
        try:
            while chunk := os.read(master, 65536):
                err.extend(chunk)
        except OSError:
            pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "logs", job_id, "-f", "--notify"], cwd=orch.cwd,
                          env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, timeout=120)
    os.close(slave)
    reader.join(timeout=10)
    assert proc.returncode == 0 and b"\a" in err
    again = json.loads(orch("submit", str(write_job(orch.cwd, "sleepy", "local", SLEEPER)), "--json").stdout)["job_id"]
    piped = orch("logs", again, "-f", "--notify", env={"PATH": "/usr/bin:/bin"})
    assert "\a" not in piped.stderr and "succeeded" in piped.stderr


def test_the_notifier_per_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(notify.shutil, "which", lambda name: "/usr/bin/" + name)
    argv = notify.notifier('orch: a"b', "failed: C:\\path")
    assert argv == ["osascript", "-e", 'display notification "failed: C:\\\\path" with title "orch: a\\"b"']
    monkeypatch.setattr(sys, "platform", "linux")
    assert notify.notifier("t", "b") == ["notify-send", "--app-name=orch", "t", "b"]
    monkeypatch.setattr(notify.shutil, "which", lambda name: None)
    assert notify.notifier("t", "b") is None

"""``orch controller up|status|logs|down`` through the CLI: on the loopback sshd account (the
controller outlives the SSH session, its secrets only in memory, one per folder) and on
``local`` with a crontab (the @reboot line brings it back, lacking its secrets)."""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import subprocess
from pathlib import Path

from tests.e2e.controller.conftest import controller_pid
from tests.support.orch import Orch
from tests.support.poll import wait_until


def files_holding(folder: Path, text: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and not p.is_socket() and text.encode() in p.read_bytes()]


def gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped counts: it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_controller_on_an_ssh_host_outlives_the_session_and_holds_secrets_in_memory_only(
        orch: Orch, box: str, controllers: list[str]) -> None:
    value = secrets.token_hex(16)
    controllers.append(box)
    up = orch("controller", "up", box, "--secret", "ORCH_T_TOKEN", env={"ORCH_T_TOKEN": value})
    assert "controller on box: started" in up.stdout
    assert "box has no crontab" in up.stdout  # this machine has none: said, not hidden
    assert "secrets in its memory: ORCH_T_TOKEN" in up.stdout
    pid = controller_pid(orch, box)
    assert pid is not None and os.getsid(pid) == pid  # its own session: the SSH session that started it is gone
    folder = orch.remote_root / "controller"
    assert (folder / "secret-names.json").read_text().strip() == '["ORCH_T_TOKEN"]'
    assert files_holding(folder, value) == []

    # up again keeps the one that runs; a second controller of the folder is refused
    again = orch("controller", "up", box, env={"ORCH_T_TOKEN": value})
    assert "already running" in again.stdout and controller_pid(orch, box) == pid
    words = shlex.split((folder / "start.sh").read_text().split("\nexec ", 1)[1])
    words[-1] = words[-1].removesuffix("start") + "run"  # start.sh's command, as the controller itself
    second = subprocess.run(words, capture_output=True, text=True, timeout=60)
    assert second.returncode == 3, second
    assert f"another controller (pid {pid}) holds" in second.stdout

    # killed, started without the secret: it says what it lacks; up with it resends it
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: gone(pid), what="the controller killed", timeout=30)
    down = orch("controller", "status", box, check=1)
    assert "controller on box: down" in down.stdout
    restarted = orch("controller", "up", box)
    assert "controller on box: started" in restarted.stdout
    assert "the controller lacks ORCH_T_TOKEN" in restarted.stderr
    assert "missing secrets: ORCH_T_TOKEN" in orch("controller", "status", box).stdout
    orch("controller", "up", box, env={"ORCH_T_TOKEN": value})
    status = orch.json("controller", "status", box)
    assert status["secrets"] == {"held": ["ORCH_T_TOKEN"], "missing": []}
    assert files_holding(folder, value) == []

    logs = orch("controller", "logs", box).stdout
    assert "secrets received: ORCH_T_TOKEN" in logs and value not in logs
    pid = status["pid"]
    assert f"controller on box: stopped (pid {pid})" in orch("controller", "down", box).stdout
    wait_until(lambda: gone(pid), what="the controller's exit after down", timeout=30)
    assert orch("controller", "status", check=1).stdout.startswith("controller on box: down")  # the recorded host


def test_a_crontab_line_starts_the_controller_again_after_a_reboot(orch: Orch, crontab: Path,
                                                                  controllers: list[str]) -> None:
    controllers.append("local")
    up = orch("controller", "up", "local", "--secret", "ORCH_T_TOKEN", env={"ORCH_T_TOKEN": "s3"})
    assert "an @reboot line in the crontab starts it again" in up.stdout
    lines = crontab.read_text().splitlines()
    reboot = [line for line in lines if line.startswith("@reboot ")]
    assert len(reboot) == 1
    orch("controller", "up", "local", env={"ORCH_T_TOKEN": "s3"})
    assert crontab.read_text().splitlines() == lines  # not added twice

    pid = controller_pid(orch, "local")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # the machine went down
    wait_until(lambda: gone(pid), what="the controller killed", timeout=30)
    env = {k: v for k, v in orch.env.items() if k != "ORCH_T_TOKEN"}
    subprocess.run(["sh", "-c", reboot[0].removeprefix("@reboot ")], env=env, check=True, timeout=120,
                   capture_output=True)  # what cron runs at boot
    status = orch.json("controller", "status", "local")
    assert status["running"] and status["pid"] != pid
    assert status["secrets"] == {"held": [], "missing": ["ORCH_T_TOKEN"]}

    orch("controller", "down", "local")
    assert [line for line in crontab.read_text().splitlines() if "orch" in line] == []

"""supervisor/environment.py, attempt.py and launchers.py: the job's PATH (with a real bash,
login shell included), resume arguments, and a launcher's argv made whole on its node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from remote_payload.contract.jobfolder import FREE_PORT
from remote_payload.supervisor import attempt, environment, launchers


def test_the_hosts_python_comes_first_and_a_login_shell_keeps_it(tmp_path: Path) -> None:
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    env = environment.job_environment(base, {"PATH": "/opt/v/bin:$PATH"}, str(tmp_path), 3)
    bindir = os.path.dirname(sys.executable)
    assert env["PATH"].split(":")[:2] == ["/opt/v/bin", bindir] and env["PATH"].endswith(":/usr/bin:/bin")
    assert env["ORCH_ATTEMPT"] == "3" and env["ORCH_PATH_FRONT"].startswith(f"/opt/v/bin:{bindir}")
    environment.write_bash_env(str(tmp_path))
    # a profile that resets PATH, as Debian's /etc/profile does for root
    (tmp_path / ".bash_profile").write_text("PATH=/usr/bin:/bin\n")
    out = subprocess.run(["/bin/bash", "-l", "-c", 'echo "$PATH"'], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out.startswith(f"/opt/v/bin:{bindir}") and out.endswith("/usr/bin:/bin")
    again = subprocess.run(["/bin/bash", "-c", 'bash -c "echo \\$PATH"'], env=env, capture_output=True, text=True,
                           check=True).stdout.strip()
    assert again == env["PATH"]  # nested shells do not stack the front twice


def test_a_jobs_own_bash_env_still_runs(tmp_path: Path) -> None:
    mine = tmp_path / "mine.sh"
    mine.write_text("export MINE=yes\n")
    env = environment.job_environment({"PATH": "/usr/bin:/bin"}, {"BASH_ENV": str(mine)}, str(tmp_path), 1)
    environment.write_bash_env(str(tmp_path))
    out = subprocess.run(["/bin/bash", "-c", 'echo "$MINE"'], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "yes" and env["BASH_ENV"] == str(tmp_path / environment.BASH_ENV_NAME)


def test_resume_args_fill_in_the_newest_checkpoint(tmp_path: Path) -> None:
    said: list[str] = []
    for n in (5, 40, 7):
        folder = tmp_path / "code" / "out" / f"checkpoint-{n}"
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_text("{}")
    argv = attempt.resume_argv(["python", "t.py"], ["--resume_from_checkpoint", "{last_checkpoint}"], str(tmp_path),
                               said.append)
    assert argv == ["python", "t.py", "--resume_from_checkpoint", str(tmp_path / "code" / "out" / "checkpoint-40")]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert attempt.resume_argv(["t"], ["--ckpt={last_checkpoint}"], str(empty), said.append) == ["t"]
    assert said[-1].startswith("the script starts over: no complete checkpoint for {last_checkpoint}")
    assert said[-1].endswith("resume_args left out")


def test_the_step_reached_is_the_highest_in_the_file(tmp_path: Path) -> None:
    assert attempt.reached_step(str(tmp_path)) is None
    rows = [{"step": 3}, {"step": 12, "loss": 1}, "not json", {"step": 7}, {"step": True}, {"eval_loss": 2}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows))
    assert attempt.reached_step(str(tmp_path)) == 12


def test_a_free_port_and_deepspeeds_gpus_are_filled_in(tmp_path: Path) -> None:
    node0 = {"node_rank": 0, "nproc": 2, "launcher": "deepspeed"}
    job = {"nodes": [node0]}
    argv = ["py", "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", FREE_PORT, "d.py"]
    out = launchers.complete(argv, job, node0, {}, str(tmp_path))
    assert out[:5] == argv[:5] and int(out[6]) > 0 and out[7] == "d.py"
    given = launchers.complete(argv, job, node0, {"CUDA_VISIBLE_DEVICES": "2,3"}, str(tmp_path))
    assert given[:5] == ["py", "-m", "deepspeed.launcher.runner", "--include", "localhost:2,3"]
    assert "--num_gpus" not in given
    node1 = {"node_rank": 1, "nproc": 2, "launcher": "deepspeed"}
    two = {"nodes": [dict(node0), node1]}
    multi = ["py", "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--num_nodes", "2", "--node_rank", "1",
             "--no_ssh", "--hostfile", str(tmp_path / "deepspeed_hostfile"), "d.py"]
    out = launchers.complete(multi, two, node1, {"CUDA_VISIBLE_DEVICES": "1,3"}, str(tmp_path))
    assert (tmp_path / "deepspeed_hostfile").read_text() == "node0 slots=2\nnode1 slots=4\n"
    assert out[3:5] == ["--include", "node0:0,1@node1:1,3"] and "--num_nodes" not in out

"""The walking skeleton end to end, against `local` and the loopback sshd: submit, follow,
status, fetch, refetch, failure, cancel, lost supervisor, connection closed mid-job."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

from orchestrator.trace import PHASE_WIDTH
from remote_payload.jobdir import processes
from remote_payload.jobdir.processes import group_alive
from tests.support.orch import Orch, write_job

SLOW = """\
import os, pathlib, sys, time
n, delay = int(sys.argv[1]), float(sys.argv[2])
out = pathlib.Path(os.environ["ORCH_JOB_DIR"]) / "outputs"
(out / "sub").mkdir(parents=True, exist_ok=True)
for i in range(n):
    print(f"line {i}", flush=True)
    time.sleep(delay)
(out / "result.bin").write_bytes(bytes(range(256)) * 4000)
(out / "sub" / "note.txt").write_text("done\\n")
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


def slow_job(orch: Orch, host: str, n: int = 5, delay: float = 0.2, name: str = "slow", extra: str = "") -> Path:
    spec = write_job(orch.cwd, name, host, ["python", "slow.py", str(n), str(delay)], extra)
    (orch.cwd / "ws" / "slow.py").write_text(SLOW)
    return spec


def assert_group_gone(pgid: int) -> None:
    """The process group has no live (non-zombie) member left within a few seconds."""
    deadline = time.time() + 10
    while group_alive(pgid) and time.time() < deadline:
        time.sleep(0.1)
    assert not group_alive(pgid)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_submit_follow_fetch_and_refetch(orch: Orch, host: str) -> None:
    spec = slow_job(orch, host)
    done = orch("submit", str(spec), "--follow", "--json")
    result = json.loads(done.stdout)
    assert result["state"] == "succeeded" and result["exit_code"] == 0
    assert [f"line {i}" for i in range(5)] == [l for l in done.stderr.splitlines() if l.startswith("line ")]
    job = result["job_id"]
    status = orch.json("status", job)
    assert status["state"] == "succeeded"

    fetched = orch("fetch", job)
    local = orch.cwd / "runs" / job
    remote = orch.job_dir(job)
    for rel in ("outputs/result.bin", "outputs/sub/note.txt", "logs/node0.log"):
        assert sha(local / rel) == sha(remote / rel)
    assert not list(local.rglob("*.part"))
    assert "4 fetched" in fetched.stdout  # + logs/supervisor-node0.log
    again = orch("fetch", job)
    assert "0 fetched (0.0 MB), 4 already there" in again.stdout

    logs = orch("logs", job)
    assert "line 4" in logs.stdout and "[orch] job succeeded" in logs.stdout
    tail = orch("logs", job, "--tail", "2")
    assert tail.stdout.splitlines() == logs.stdout.splitlines()[-2:]


def test_failing_command_is_failed_with_exit_1(orch: Orch, host: str) -> None:
    spec = slow_job(orch, host, n=1, extra="env: {EXIT_WITH: '3'}\n")
    done = orch("submit", str(spec), "--follow", "--json", check=1)
    result = json.loads(done.stdout)
    assert result["state"] == "failed" and result["exit_code"] != 0
    assert "exited with code" in result["reason"]


def test_cancel_stops_the_process_group(orch: Orch, host: str) -> None:
    spec = slow_job(orch, host, n=1000, delay=0.1)
    job = orch.json("submit", str(spec))["job_id"]
    status = orch.wait_state(job, ("running",))
    assert status["state"] == "running"
    deadline = time.time() + 60
    while "line 3" not in orch("logs", job).stdout and time.time() < deadline:
        time.sleep(0.2)
    running = orch.json("status", job)
    workers = [tuple(p) for p in running["procs"]]
    assert workers  # the script itself (a direct start; torchrun's tree: tests/remote_payload/supervisor/test_launch_direct.py)
    assert orch("cancel", job, "--grace", "5").stdout.strip().endswith("cancelled")
    assert orch.json("status", job)["state"] == "cancelled"
    assert_group_gone(running["pgid"])
    assert processes.alive(workers) == []


def test_killed_supervisor_is_unsupervised_while_its_processes_run_then_lost(orch: Orch, host: str) -> None:
    spec = slow_job(orch, host, n=1000, delay=0.1)
    job = orch.json("submit", str(spec))["job_id"]
    status = orch.wait_state(job, ("running",))
    os.kill(status["supervisor_pid"], signal.SIGKILL)
    time.sleep(0.3)
    orphaned = orch.json("status", job)
    assert orphaned["state"] == "running" and orphaned["unsupervised"] and "supervisor" in orphaned["reason"]
    for pid, _ in processes.alive([tuple(p) for p in status["procs"]]):
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)
    lost = orch.json("status", job)
    assert lost["state"] == "lost" and "supervisor" in lost["reason"]
    orch("cancel", job, "--grace", "2")
    assert_group_gone(status["pgid"])
    assert processes.alive([tuple(p) for p in status["procs"]]) == []


def test_job_survives_the_submitting_connection(orch: Orch, box: str) -> None:
    spec = slow_job(orch, box, n=10, delay=0.2)
    job = orch.json("submit", str(spec))["job_id"]  # this orch process, and its SSH session, end here
    status = orch.wait_state(job, ("succeeded", "failed", "lost"), timeout=90)
    assert status["state"] == "succeeded"
    assert "line 9" in (orch.job_dir(job) / "logs" / "node0.log").read_text()


def test_status_lists_jobs_as_a_table(orch: Orch, host: str) -> None:
    spec = slow_job(orch, host, n=1, delay=0)
    job = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]
    table = orch("status").stdout
    assert job in table and "succeeded" in table
    assert orch.json("ls")[0]["job_id"] == job


def test_dry_run_prints_the_plan_and_starts_nothing(orch: Orch, host: str) -> None:
    spec = slow_job(orch, host)
    plan = json.loads(orch("submit", str(spec), "--dry-run").stdout)
    node = plan["nodes"][0]
    assert node["direct"] is True  # one node × one process: started without torchrun (launch.launcher: auto)
    assert node["argv"][1:] == ["slow.py", "5", "0.2"] and node["argv"][0].endswith(("python", "python3"))
    assert plan["job_dir"] == f"{plan['root']}/jobs/{plan['job_id']}"
    assert orch.json("ls") == []


def test_setup_runs_once_and_is_skipped_when_unchanged(orch: Orch, host: str, tmp_path: Path) -> None:
    counter = tmp_path / "setup-count"
    extra = f"setup: echo ran >> {counter}\n"
    spec = slow_job(orch, host, n=1, delay=0, extra=extra)
    first = orch("submit", str(spec), "--follow")
    assert "[orch] running setup" in first.stdout
    second = orch("submit", str(spec), "--follow")
    assert "setup unchanged since its last success on this host: skipped" in second.stdout
    assert counter.read_text() == "ran\n"


def test_failing_setup_fails_the_job_before_launch(orch: Orch, host: str) -> None:
    spec = slow_job(orch, host, n=1, delay=0, extra="setup: exit 7\n")
    result = json.loads(orch("submit", str(spec), "--follow", "--json", check=1).stdout)
    assert result["state"] == "failed" and result["reason"] == "setup failed with exit code 7"
    assert "line 0" not in (orch.job_dir(result["job_id"]) / "logs" / "node0.log").read_text()


def test_a_trainer_job_on_a_bare_python_fails_naming_what_to_install(orch: Orch, sshd, tmp_path: Path) -> None:
    orch("hosts", "add", "bare", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root), "--python", "/usr/bin/python3", "--trust")
    (orch.cwd / "ws").mkdir()
    (orch.cwd / "ws" / "train.jsonl").write_text('{"text": "hello"}\n')
    spec = orch.cwd / "t.yaml"
    spec.write_text(json.dumps({"name": "bare", "hosts": ["bare"], "workspace": {"path": "ws"},
                                "train": {"model": "m", "data": {"train": "train.jsonl", "format": "text"}}}))
    result = json.loads(orch("submit", str(spec), "--follow", "--json", check=1).stdout)
    assert result["state"] == "failed"
    assert "the built-in trainer needs torch" in result["reason"] and "pip install" in result["reason"]


def traced(text: str) -> list[str]:
    """The phases of ``ORCH_TRACE`` lines (``orch-trace PID  +  12.3 ms  PHASE  detail``), in order."""
    return [line.split(" ms  ", 1)[1][:PHASE_WIDTH].strip() for line in text.splitlines()
            if line.startswith("orch-trace ")]


def test_orch_trace_says_each_phase_of_a_submit_in_order(orch: Orch, box: str, tmp_path: Path) -> None:
    spec = slow_job(orch, box, n=2, delay=0.05)
    lines = tmp_path / "trace.txt"
    done = orch("submit", str(spec), "--follow", env={"ORCH_TRACE": str(lines)})
    assert "orch-trace" not in done.stderr  # a path: the lines go there
    phases = traced(lines.read_text())
    order = ["cli start", "selection", "connect", "helper start", "hello", "plan", "send", "launch", "launched",
             "first line", "exit"]
    assert [p for p in phases if p in order] == order, phases
    again = orch("submit", str(spec), env={"ORCH_TRACE": "1"})  # no change: its code set apart in hello, no send
    phases = traced(again.stderr)
    assert [p for p in phases if p in order + ["stage"]] == \
        ["cli start", "selection", "connect", "helper start", "hello", "plan", "stage", "launch", "launched", "exit"]
    assert "orch-trace" not in orch("status").stderr  # off unless asked

"""The GPU queue with real jobs on `local` and the loopback sshd, fake GPU inventories
(tests/support/gpuqueue.py): side by side when the box has room, one after another when not,
`queued #N` in orch status and orch queue, priority before FIFO, cancel of a queued job, a
queued job started with no laptop around, a supervisor killed while queued, a dead holder's
GPUs freed, an unsupervised job holding its GPU until its processes end (and resume or
cancel handing it over), GPUs busy with other processes never handed out, never two jobs on
one GPU, and the idle guard counting a queued job as work."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from rich.cells import cell_len

from tests.support.gpuqueue import Gate, queued_at, submit
from tests.support.orch import Orch, stop_holders
from tests.support.poll import wait_until

ALL_DONE = ("succeeded", "failed", "cancelled", "lost")


def test_side_by_side_when_there_is_room_one_after_another_when_not(orch: Orch, host: str, gate: Gate) -> None:
    a, b = submit(orch, gate, host, "a"), submit(orch, gate, host, "b")
    assert {gate.wait_started("a"), gate.wait_started("b")} == {"0", "1"}  # two 1-GPU jobs, one GPU each
    c = submit(orch, gate, host, "c")
    queued_at(orch, c, 1)
    table = orch("status", env={"COLUMNS": "80"}).stdout.splitlines()
    assert all(cell_len(line) <= 80 for line in table)
    assert any(line.split()[0] in c and " queued #1 " in f"{line} " for line in table[1:]), table
    shown = orch("queue", host).stdout
    assert f"{host}: 2 GPU(s), 2 held by orch jobs, 0 free" in shown
    assert f"1  {c}  queued" in shown and f"{a}  running  {gate.started('a')}" in shown
    assert gate.started("c") is None
    gate.release("a")
    assert gate.wait_started("c") == gate.started("a")  # the GPU a gave back
    for name in ("b", "c"):
        gate.release(name)
    for job in (a, b, c):
        assert orch.wait_state(job, ALL_DONE)["state"] == "succeeded"
    assert gate.ran("a")["end"] < gate.ran("c")["start"]
    assert {gate.ran(n)["order"] for n in "abc"} == {"PCI_BUS_ID"}
    assert orch.json("queue", host)[0]["jobs"] == []


def test_priority_goes_first_and_a_queued_job_cancels_at_once(orch: Orch, gate: Gate) -> None:
    a = submit(orch, gate, "local", "a", gpus=1)
    gate.wait_started("a")
    b = submit(orch, gate, "local", "b", gpus=1)
    queued_at(orch, b, 1)
    c = submit(orch, gate, "local", "c", gpus=1, launch="  priority: 5\n")
    d = submit(orch, gate, "local", "d", gpus=1)
    queued_at(orch, c, 1)
    queued_at(orch, b, 2)
    queued_at(orch, d, 3)
    listed = orch.json("queue", "local")[0]
    assert [(j["job_id"], j["state"], j["position"], j["priority"]) for j in listed["jobs"]] == [
        (a, "running", None, 0), (c, "waiting", 1, 5), (b, "waiting", 2, 0), (d, "waiting", 3, 0)]
    assert orch("cancel", d, "--grace", "2").stdout.strip() == f"{d}: cancelled"
    assert gate.started("d") is None and "holding" not in (orch.job_dir(d) / "logs" / "node0.log").read_text()
    gate.release("a")
    assert gate.wait_started("c") == "0"  # priority 5 before b, which was queued first
    queued_at(orch, b, 1)
    gate.release("c")
    assert gate.wait_started("b") == "0"
    gate.release("b")
    assert [orch.wait_state(j, ALL_DONE)["state"] for j in (a, b, c, d)] == ["succeeded"] * 3 + ["cancelled"]


def test_a_queued_job_starts_after_the_laptop_has_gone(orch: Orch, box: str, gate: Gate) -> None:
    a = submit(orch, gate, box, "a", gpus=1)
    gate.wait_started("a")
    b = submit(orch, gate, box, "b", gpus=1)
    queued_at(orch, b, 1)
    stop_holders(orch.home)  # no orch process of the laptop is left: the server is on its own
    status = orch.remote_root / "jobs" / b / "status.json"
    gate.release("a")
    gate.wait_started("b")
    gate.release("b")
    wait_until(lambda: json.loads(status.read_text())["state"] == "succeeded",
               what="b to succeed on the server", timeout=120)
    assert json.loads(status.read_text())["gpus"] == [0]
    assert orch.json("status", b)["state"] == "succeeded" and orch.json("status", a)["state"] == "succeeded"


def _kill_supervisor(orch: Orch, job: str, with_processes: bool = False) -> None:
    status = json.loads((orch.job_dir(job) / "status.json").read_text())
    pids = [status["supervisor_pid"]] + ([p[0] for p in status.get("procs") or []] if with_processes else [])
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_supervisor_killed_while_queued_resumes_into_the_queue_and_a_dead_holder_frees_its_gpu(
        orch: Orch, host: str, gate: Gate) -> None:
    a = submit(orch, gate, host, "a", gpus=1)
    gate.wait_started("a")
    b = submit(orch, gate, host, "b", gpus=1)
    queued_at(orch, b, 1)
    _kill_supervisor(orch, b)
    assert orch.wait_state(b, ("lost",))["state"] == "lost"
    assert [j["job_id"] for j in orch.json("queue", host)[0]["jobs"]] == [a]  # its entry is gone
    orch("resume", b)
    queued_at(orch, b, 1)  # back in the queue, behind the GPU a holds
    _kill_supervisor(orch, a, with_processes=True)  # the holder dies: its GPU is free again
    assert orch.wait_state(a, ("lost",))["state"] == "lost"
    assert gate.wait_started("b") == "0"
    gate.release("b")
    assert orch.wait_state(b, ALL_DONE)["state"] == "succeeded"
    log = (orch.job_dir(b) / "logs" / "node0.log").read_text()
    assert log.count("queued #1") >= 2 and "GPU(s) 0 granted" in log


def test_gpus_busy_with_other_processes_are_not_handed_out(orch: Orch, gate: Gate) -> None:
    submit(orch, gate, "local", "a", gpus=2, busy="0")
    assert gate.wait_started("a") == "1"
    b = submit(orch, gate, "local", "b", gpus=2, busy="0")
    status = queued_at(orch, b, 1)
    assert "busy with other processes: GPU 0" in status["reason"]
    assert "2 GPU(s), 1 held by orch jobs, 0 free, busy with other processes: GPU 0" in orch("queue").stdout
    never = submit(orch, gate, "local", "never", gpus=2, busy="0", launch="  gpus: 3\n")  # the same host
    failed = orch.wait_state(never, ALL_DONE)
    assert failed["state"] == "failed" and "launch.gpus: the job needs 3 GPU(s); this host has 2" in failed["reason"]
    gate.release("a")
    assert gate.wait_started("b") == "1"
    gate.release("b")
    assert orch.wait_state(b, ALL_DONE)["state"] == "succeeded"


def test_never_two_jobs_on_one_gpu(orch: Orch, gate: Gate) -> None:
    names = [f"n{k}" for k in range(6)]
    jobs = [submit(orch, gate, "local", name, gpus=2, hold_s=1.5) for name in names]
    # both GPUs taken before any job ends (released as they were submitted, a slow machine's
    # submits came after the previous job had ended, and every job ran on GPU 0)
    wait_until(lambda: sum(gate.started(n) is not None for n in names) >= 2, what="two jobs to run", timeout=120)
    for name in names:
        gate.release(name)  # each runs 1.5 s at least, then gives its GPU back
    assert [orch.wait_state(j, ALL_DONE, timeout=180)["state"] for j in jobs] == ["succeeded"] * 6
    runs = sorted((gate.ran(n)["visible"], gate.ran(n)["start"], gate.ran(n)["end"]) for n in names)
    assert {gpu for gpu, _, _ in runs} == {"0", "1"}
    for (gpu, _, end), (next_gpu, start, _) in zip(runs, runs[1:]):
        assert gpu != next_gpu or end <= start, runs  # one GPU's runs never overlap


def test_the_idle_guard_counts_a_queued_job_as_work(orch: Orch, sshd, gate: Gate, tmp_path: Path) -> None:
    marker = tmp_path / "idle-off"
    orch("hosts", "add", "idle", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root), "--python", sys.executable, "--idle-shutdown-minutes", "0.05", "--trust")
    off = [sys.executable, "-c", "import pathlib, sys; pathlib.Path(sys.argv[1]).touch()", str(marker)]
    finish = f"on_finish: {json.dumps({'shutdown_command': off})}\n"  # powering off: a harmless marker
    a = submit(orch, gate, "idle", "a", gpus=1, extra=finish)
    gate.wait_started("a")
    b = submit(orch, gate, "idle", "b", gpus=1, extra=finish)
    queued_at(orch, b, 1)
    gate.release("a")
    assert orch.wait_state(a, ALL_DONE)["state"] == "succeeded"
    gate.wait_started("b")
    assert "idle guard" not in (orch.job_dir(a) / "logs" / "node0.log").read_text()
    gate.release("b")
    wait_until(marker.exists, what="the idle guard of the last job to power off", timeout=120)
    assert "idle guard: no orch job for" in (orch.job_dir(b) / "logs" / "node0.log").read_text()


def test_queue_without_jobs_and_on_a_slurm_host(orch: Orch) -> None:
    assert "no unfinished jobs" in orch("queue").stdout
    orch("hosts", "add", "lab", "--ssh", "ssh -p 9 u@127.0.0.1", "--scheduler", "slurm")
    refused = orch("queue", "lab", check=2)
    assert "lab is a Slurm cluster: its queue is Slurm's" in refused.stderr and "Traceback" not in refused.stderr


def test_an_unsupervised_job_keeps_its_gpu_until_its_processes_end(orch: Orch, box: str, gate: Gate) -> None:
    a = submit(orch, gate, box, "a", gpus=1)
    gate.wait_started("a")
    wait_until(lambda: json.loads(
        (orch.job_dir(a) / "status.json").read_text()).get("procs"),
        what="a's process tree in status.json", timeout=120)
    _kill_supervisor(orch, a)  # only the supervisor: hold.py still runs on GPU 0
    assert orch.json("status", a).get("unsupervised") is True
    b = submit(orch, gate, box, "b", gpus=1)
    queued_at(orch, b, 1)
    shown = orch("queue", box).stdout
    assert f"{a}  unsupervised  0" in shown and f"1  {b}  queued" in shown
    wait_until(lambda: "queued #1" in (orch.job_dir(b) / "logs" / "node0.log").read_text(),
               what="a few queue passes", timeout=120)
    assert gate.started("b") is None and orch.json("status", b)["state"] == "queued"
    gate.release("a")  # a's last process ends: only now is GPU 0 free
    assert gate.wait_started("b") == "0"
    gate.release("b")
    assert orch.wait_state(b, ALL_DONE)["state"] == "succeeded"
    assert gate.ran("a")["end"] < gate.ran("b")["start"]


def test_resume_and_cancel_of_an_unsupervised_job_hand_its_gpu_over(orch: Orch, box: str, gate: Gate) -> None:
    a = submit(orch, gate, box, "a", gpus=1)
    gate.wait_started("a")
    wait_until(lambda: json.loads((orch.job_dir(a) / "status.json").read_text()).get("procs"),
               what="a's process tree", timeout=120)
    _kill_supervisor(orch, a)
    b = submit(orch, gate, box, "b", gpus=1)
    queued_at(orch, b, 1)
    (gate.path / "a.started").unlink()
    orch("resume", a)  # stops a's earlier attempt first: b, waiting longer, gets GPU 0; a queues behind it
    assert gate.wait_started("b") == "0"
    queued_at(orch, a, 1)
    assert gate.started("a") is None
    wait_until(lambda: json.loads((orch.job_dir(b) / "status.json").read_text()).get("procs"),
               what="b's process tree", timeout=120)
    _kill_supervisor(orch, b)
    assert orch.json("status", b).get("unsupervised") is True
    assert gate.started("a") is None
    orch("cancel", b, "--grace", "2")  # stops b's processes: a gets GPU 0
    assert gate.wait_started("a") == "0"
    assert orch.wait_state(b, ALL_DONE)["state"] == "cancelled"
    gate.release("a")
    assert orch.wait_state(a, ALL_DONE)["state"] == "succeeded"

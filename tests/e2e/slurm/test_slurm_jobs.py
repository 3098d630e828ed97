"""orch on a real Slurm cluster through its login node (the loopback sshd): submit, states,
logs, cancel, resume — the user's own script and the built-in trainer (docs/slurm.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest
import torch
from safetensors.torch import load_file

from tests.support.orch import Orch, exact_workspace
from tests.support.poll import wait_until
from tests.support.proxy import FaultProxy
from tests.support.serverhooks import set_host_hooks
from tests.support.slurm import WAIT_S, SlurmCluster, SlurmLogin, available, start_slurm
from tests.support.sshd import SSHServer
from tests.support.tiers import needs

SCRIPT = """\
import os
rank = int(os.environ.get("RANK", 0))
print(f"rank {rank} of {os.environ.get('WORLD_SIZE')} on node {os.environ.get('SLURM_NODEID')}", flush=True)
if rank == 0:
    out = os.path.join(os.environ["ORCH_JOB_DIR"], "outputs")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "done.txt"), "w") as f:
        f.write("ok\\n")
"""


def add_lab(orch: Orch, login: SlurmLogin, name: str = "lab", *extra: str) -> str:
    """The cluster as an inventory host, as a user adds it (SLURM_CONF: the test cluster's)."""
    orch("hosts", "add", name, "--ssh", f"ssh -p {login.port} root@127.0.0.1", "--identity", str(login.client_key),
         "--root", str(orch.remote_root), "--python", sys.executable, "--scheduler", "slurm",
         "--slurm-env", f"SLURM_CONF={login.cluster.conf}", *extra, "--trust")
    return name


def job_file(tmp_path: Path, name: str, body: str, script: str = SCRIPT) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "job.py").write_text(script)
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(f"name: {name}\nworkspace: {{path: ws}}\n{body}")
    return spec


def last_job(orch: Orch) -> dict:
    return orch.json("status")[0]


@pytest.fixture
def lab(orch: Orch, slurm_login: SlurmLogin) -> str:
    return add_lab(orch, slurm_login)


def test_own_script_runs_under_torchrun_in_an_allocation(orch: Orch, lab: str, slurm: SlurmCluster,
                                                         tmp_path: Path) -> None:
    spec = job_file(tmp_path, "hello", f"hosts: [{lab}]\nlaunch:\n  nproc_per_node: 2\n  command: python job.py\n"
                                       "  slurm: {time: '5'}\n")
    done = orch("submit", str(spec), "--follow", timeout=300, check=None)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rank 0 of 2 on node 0" in done.stdout and "rank 1 of 2 on node 0" in done.stdout, done.stdout
    status = last_job(orch)
    assert status["state"] == "succeeded", status


def train_spec(orch: Orch, assets: Path, host: str, name: str, launch: dict, max_steps: int = 6,
               step_delay_s: float = 0) -> Path:
    """The built-in trainer on the tiny GPT-2 with LoRA, no dropout (exact comparisons);
    ``step_delay_s``: from now on every trainer job on ``host`` sleeps that long after each step."""
    exact_workspace(orch.cwd, assets)
    if step_delay_s:
        set_host_hooks(orch, host, step_delay_s=step_delay_s)
    spec = orch.cwd / f"{name}.yaml"
    spec.write_text(json.dumps({
        "name": name, "hosts": [host], "workspace": {"path": "ws"}, "launch": launch,
        "train": {"model": "assets/tiny-gpt2", "finetune": "lora",
                  "lora": {"r": 4, "dropout": 0.0, "target_modules": ["c_attn"]},
                  "data": {"train": "assets/data/train.jsonl", "max_length": 48}, "precision": "fp32",
                  "batch_size": 2, "max_steps": max_steps, "save_every": 1000, "eval_every": 1000, "log_every": 1},
    }))
    return spec


def adapter(orch: Orch, job_id: str) -> dict:
    orch("fetch", job_id)
    return load_file(orch.cwd / "runs" / job_id / "outputs" / "adapter_model.safetensors")


def assert_same_adapter(a: dict, b: dict, exact: bool = False) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if exact:
            assert torch.equal(a[key], b[key]), key
        else:
            torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)


def test_two_nodes_of_two_train_like_one_node_of_four(orch: Orch, slurm2_login: SlurmLogin, tiny_assets: Path) -> None:
    lab2 = add_lab(orch, slurm2_login, "lab2")
    multi = json.loads(orch("submit", str(train_spec(orch, tiny_assets, lab2, "two", {"nnodes": 2, "nproc_per_node": 2})),
                            "--follow", "--json", timeout=600).stdout)
    assert multi["state"] == "succeeded", multi
    single = json.loads(orch("submit", str(train_spec(orch, tiny_assets, "local", "one", {"nproc_per_node": 4})),
                             "--follow", "--json", timeout=600).stdout)
    assert single["state"] == "succeeded", single
    assert_same_adapter(adapter(orch, multi["job_id"]), adapter(orch, single["job_id"]))
    logs = {p.name for p in (orch.cwd / "runs" / multi["job_id"] / "logs").iterdir()}
    assert {"node0.log", "node1.log"} <= logs, logs
    merged = orch("logs", multi["job_id"]).stdout
    assert "[node 0] " in merged and "[node 1] " in merged, merged


def remote_job_dir(orch: Orch, job_id: str) -> Path:
    return orch.remote_root / "jobs" / job_id


def test_dry_run_prints_the_exact_batch_script_and_submits_nothing(orch: Orch, lab: str, slurm: SlurmCluster,
                                                                   tmp_path: Path) -> None:
    spec = job_file(tmp_path, "dry", f"hosts: [{lab}]\nlaunch:\n  nproc_per_node: 2\n  command: python job.py\n"
                                     "  slurm: {time: '1:00:00', mem: 2G, requeue: true, signal_before_s: 300}\n")
    out = orch("submit", str(spec), "--dry-run").stdout
    plan_json, _, script = out.partition("\n# ")
    plan = json.loads(plan_json)
    job_dir = plan["job_dir"]
    assert script.splitlines()[0] == f"{job_dir}/slurm.sh, submitted with sbatch on {lab}:"
    body = script.split("\n", 1)[1]
    assert body == plan["slurm"]["script"]
    assert body.splitlines()[:2] == ["#!/bin/bash", f"#SBATCH --job-name={plan['job_id']}"]
    for line in ("#SBATCH --nodes=1", "#SBATCH --gres=gpu:2", "#SBATCH --mem=2G", "#SBATCH --time=1:00:00",
                 "#SBATCH --requeue", "#SBATCH --signal=B:USR1@300", f"#SBATCH --chdir={job_dir}"):
        assert line in body.splitlines(), line
    assert body.splitlines()[-1].endswith(f"remote_payload/supervisor/supervisor.py --job-dir {job_dir} --node-rank 0")
    assert slurm.run("squeue", "-h").stdout.strip() == ""
    assert not (orch.remote_root / "jobs").exists() or not any((orch.remote_root / "jobs").iterdir())


def test_a_request_the_cluster_can_never_run_is_refused_before_anything_is_sent(
        orch: Orch, lab: str, slurm: SlurmCluster, tmp_path: Path) -> None:
    spec = job_file(tmp_path, "big", f"hosts: [{lab}]\nlaunch:\n  nproc_per_node: 4\n  command: python job.py\n")
    refused = orch("submit", str(spec), check=4)
    assert "Slurm could never run this job: it asks for 4 GPUs per node but the nodes of partition debug have at " \
           "most 2" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    assert orch.json("status") == []
    checked = orch("check", str(spec), "--remote", check=4)
    assert "job request" in checked.stdout and "FAIL" in checked.stdout, checked.stdout
    two = job_file(tmp_path, "wide", f"hosts: [{lab}]\nlaunch:\n  nnodes: 2\n  command: python job.py\n")
    assert "asks for 2 nodes but partition debug has 1" in orch("submit", str(two), check=4).stderr


def status_where(orch: Orch, job_id: str, what: str, ok, timeout: float = 90) -> dict:
    """`orch status JOB --json` once ``ok(status)`` holds (AssertionError naming ``what`` after ``timeout`` s)."""
    seen: list[dict] = []

    def probe() -> dict | None:
        status = orch.json("status", job_id)
        seen[:] = [status]
        return status if ok(status) else None

    try:
        return wait_until(probe, what=what, timeout=timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last status: {seen}") from None


def test_pending_jobs_say_why_and_a_pending_job_cancels(orch: Orch, lab: str, slurm: SlurmCluster,
                                                        tmp_path: Path) -> None:
    release = tmp_path / "release"
    blocker = slurm.sbatch(f"#!/bin/bash\nwhile [ ! -e {release} ]; do sleep 0.2; done\n", "--gres=gpu:2",
                           "--exclusive")
    slurm.wait_job(blocker, ("RUNNING",))
    body = f"hosts: [{lab}]\nlaunch:\n  nproc_per_node: 2\n  command: python job.py\n  slurm: {{time: '5'}}\n"
    first = orch.json("submit", str(job_file(tmp_path, "first", body)))["job_id"]
    second = orch.json("submit", str(job_file(tmp_path, "second", body)))["job_id"]
    waiting = status_where(orch, first, "the first job to wait for resources",
                           lambda s: "Resources" in (s.get("reason") or ""))
    assert waiting["state"] == "pending"
    assert waiting["reason"] == "waiting for Slurm: Resources (the nodes it needs are busy)", waiting
    behind = status_where(orch, second, "the second job to wait behind the first",
                          lambda s: "Priority" in (s.get("reason") or ""))
    assert behind["state"] == "pending" and "jobs with a higher priority go first" in behind["reason"], behind
    table = orch("status").stdout
    assert "pending" in table and "Resources" in table, table
    try:  # the partition's limit drops below what the first job asks: it can never start now
        slurm.run("scontrol", "update", "PartitionName=debug", "MaxTime=1")
        never = status_where(orch, first, "the first job to be told it can never start",
                             lambda s: "PartitionTimeLimit" in (s.get("reason") or ""))
        assert never["state"] == "pending" and "it can never start as asked" in never["reason"], never
    finally:
        slurm.run("scontrol", "update", "PartitionName=debug", "MaxTime=UNLIMITED")
    slurm_id = orch.json("status", first)["slurm_job"]
    assert orch("cancel", first).stdout.strip() == f"{first}: cancelled"
    assert slurm.wait_job(slurm_id, ("CANCELLED",))["JobState"] == "CANCELLED"
    assert orch.json("status", first)["state"] == "cancelled"
    release.touch()
    done = status_where(orch, second, "the second job to run once the node is free",
                        lambda s: s["state"] in ("succeeded", "failed", "cancelled", "lost"))
    assert done["state"] == "succeeded", done
    assert (remote_job_dir(orch, second) / "outputs" / "done.txt").read_text() == "ok\n"
    assert not (remote_job_dir(orch, first) / "logs" / "node0.log").exists()  # it never ran


SLOW_S = 1.0  # the trainer's step_delay_s on the cluster (tests/support/serverhooks.py): a long run, same numbers


def test_cancel_stops_a_running_job_gracefully_and_ends_its_allocation(orch: Orch, lab: str, slurm: SlurmCluster,
                                                                       tiny_assets: Path) -> None:
    spec = train_spec(orch, tiny_assets, lab, "stopme", {"nproc_per_node": 2}, max_steps=1000, step_delay_s=SLOW_S)
    job = orch.json("submit", str(spec))["job_id"]
    status_where(orch, job, "two steps", lambda s: (s.get("metrics") or {}).get("step", 0) >= 2)
    slurm_id = orch.json("status", job)["slurm_job"]
    assert orch("cancel", job, timeout=120).stdout.strip() == f"{job}: cancelled"
    assert slurm.wait_job(slurm_id)["JobState"] in ("COMPLETED", "CANCELLED")
    status = orch.json("status", job)
    assert status["state"] == "cancelled" and status["reason"] == "cancelled by SIGTERM", status
    (ckpt,) = (remote_job_dir(orch, job) / "checkpoints").glob("step-*")
    assert (ckpt / "COMPLETE").exists()  # the trainer got SIGTERM through srun and torchrun, and checkpointed
    assert "stopped by signal at step" in (remote_job_dir(orch, job) / "logs" / "node0.log").read_text()


def test_a_time_limit_warning_during_setup_ends_the_job_at_the_warning_and_never_starts_it(
        orch: Orch, lab: str, slurm: SlurmCluster, tmp_path: Path) -> None:
    """The warning can come before the job's step runs (here: a long setup; also a GPU-queue
    wait). The setup is stopped and the step never started, so the job ends at the warning
    with its own reason, not at Slurm's hard limit minutes later. (time 2, signal_before_s 90:
    the warning comes at slurmctld's first time-limit pass after the start; the setup's sleep
    outlasts the limit, so a warning left unheeded would end as Slurm's SIGTERM.)"""
    spec = job_file(tmp_path, "warnedsetup", f"hosts: [{lab}]\nsetup: sleep 150\nlaunch:\n  nproc_per_node: 1\n"
                                             "  command: python job.py\n"
                                             "  slurm: {time: '2', signal_before_s: 90}\n")
    job = orch.json("submit", str(spec))["job_id"]
    done = status_where(orch, job, "the job to end", lambda s: s["state"] in ("succeeded", "failed", "cancelled", "lost"),
                        timeout=240)
    assert done["state"] == "failed" and done["reason"].startswith("TIMEOUT: stopped at the warning"), done
    log = (remote_job_dir(orch, job) / "logs" / "node0.log").read_text()
    assert "running setup" in log and "Slurm's time-limit warning" in log and "starting: " not in log, log
    assert not (remote_job_dir(orch, job) / "outputs" / "done.txt").exists()


def test_time_limit_warning_checkpoints_and_resume_ends_bit_identical(orch: Orch, lab: str, slurm: SlurmCluster,
                                                                      tiny_assets: Path) -> None:
    """slurmctld sends the warning on its 30-second time-limit pass, once the job is within
    signal_before_s + 30 s of its limit: here (3 minutes, 120 s) 30 to 60 s after the start,
    before the 60 one-second steps are done. Each warned run stops after a checkpoint; `orch
    resume` submits the batch script again (warned again, perhaps) until the run ends; the
    adapter equals an uninterrupted run's bit for bit."""
    launch = {"nproc_per_node": 2, "slurm": {"time": "3", "signal_before_s": 120, "gpus_per_node": 0}}
    job = orch.json("submit", str(train_spec(orch, tiny_assets, lab, "warned", launch, max_steps=60, step_delay_s=SLOW_S)))["job_id"]
    straight = start_reference(orch, tiny_assets)
    timeouts = 0
    for _ in range(5):
        status = status_where(orch, job, "the run to end", lambda s: s["state"] in ("succeeded", "failed", "cancelled",
                                                                                    "lost"), )
        if status["state"] == "succeeded":
            break
        assert status["state"] == "failed" and status["reason"].startswith(
            "TIMEOUT: stopped at the warning before the time limit (3), after checkpointing"), status
        timeouts += 1
        orch("resume", job)
    assert status["state"] == "succeeded" and timeouts >= 1, status
    log = (remote_job_dir(orch, job) / "logs" / "node0.log").read_text()
    assert "Slurm's time-limit warning" in log and "resuming from" in log
    assert_same_adapter(adapter(orch, job), adapter(orch, finished(orch, straight)), exact=True)


def start_reference(orch: Orch, tiny_assets: Path, max_steps: int = 60) -> str:
    """The uninterrupted run a warned job must equal, submitted on ``local`` (started beside a
    Slurm job, it trains while that one sleeps through its slow steps and waits for its warning)."""
    spec = train_spec(orch, tiny_assets, "local", "straight", {"nproc_per_node": 2}, max_steps=max_steps)
    return orch.json("submit", str(spec))["job_id"]


def finished(orch: Orch, job: str) -> str:
    """``job`` once it ended, which must be a success."""
    status = orch.wait_state(job, ("succeeded", "failed", "cancelled", "lost"), timeout=600)
    assert status["state"] == "succeeded", status
    return job


@pytest.fixture(scope="module")
@needs("slurm")
def quick_requeue() -> Iterator[SlurmCluster]:
    """A cluster of its own whose requeued jobs wait 10 s, not the default 120 s: Slurm holds a
    requeued job for the credential lifetime (AuthInfo cred_expire)."""
    if available():
        pytest.fail(f"the Slurm tests need Slurm and munge (scripts/test.sh installs them): {available()}")
    workdir = Path(tempfile.mkdtemp(prefix="orch-slurm-"))
    cluster = start_slurm(workdir, extra_conf=f"AuthInfo=socket={workdir}/munge/munge.socket,cred_expire=10")
    yield cluster
    cluster.teardown()


def test_requeue_at_the_warning_continues_in_the_next_allocation_bit_identical(
        orch: Orch, quick_requeue: SlurmCluster, sshd: SSHServer, tiny_assets: Path) -> None:
    """With requeue: true the warned run checkpoints, goes back to the queue as the same Slurm
    job, and the next allocation's supervisor (attempt 2) continues from the checkpoint. Each
    allocation (4 minutes, warned 150 s before) is warned 60 to 90 s after its start
    (slurmctld's 30-second time-limit pass) and starts again 10 s or more after its requeue.
    The 90 one-second steps outlast the first allocation's warning even where the trainer starts
    in 10 s, and leave each allocation time for some steps where it takes 50 s (a slow, loaded
    machine: a 3-minute limit warned 30 s after the start left each allocation a step or two
    there, and its sixth allocation ended failed); the end is waited for across up to five."""
    lab = add_lab(orch, SlurmLogin(sshd.port, sshd.client_key, quick_requeue), "quick")
    launch = {"nproc_per_node": 2, "slurm": {"time": "4", "signal_before_s": 150, "requeue": True}}
    job = orch.json("submit", str(train_spec(orch, tiny_assets, lab, "again", launch, max_steps=90, step_delay_s=SLOW_S)))["job_id"]
    waiting = status_where(orch, job, "the requeued job to wait", lambda s: "requeued" in (s.get("reason") or ""),
                           timeout=240)
    requeued, _, slurm_says = waiting["reason"].partition("; ")
    assert waiting["state"] == "pending" and requeued == (
        "requeued at the warning before the time limit (4): the next allocation continues from the latest checkpoint"
    ), waiting
    # a loaded machine's poll may come after Slurm started the next allocation
    starting = f"starting in Slurm job {waiting['slurm_job']}"
    assert slurm_says.startswith(("waiting for Slurm:", starting + " on ")) or slurm_says == starting, waiting
    done = status_where(orch, job, "the run to end", lambda s: s["state"] in ("succeeded", "failed", "cancelled", "lost"),
                        timeout=5 * 150)
    log = remote_job_dir(orch, job) / "logs" / "node0.log"
    assert done["state"] == "succeeded" and done["attempt"] >= 2, (done.get("reason"), log.read_text()[-3000:])
    assert json.loads((remote_job_dir(orch, job) / "slurm.json").read_text())["jobs"] == [waiting["slurm_job"]]
    assert "resuming from" in (remote_job_dir(orch, job) / "logs" / "node0.log").read_text()
    straight = start_reference(orch, tiny_assets, 90)  # not beside the requeues: their timing is Slurm's, on a loaded CPU
    assert_same_adapter(adapter(orch, job), adapter(orch, finished(orch, straight)), exact=True)


TICKS = """\
import sys, time
for i in range(int(sys.argv[1])):
    print(f"tick {i:04d}", flush=True)
    time.sleep(0.1)
"""


def ticks(text: str, node: int) -> list[str]:
    return [line.split("] ", 1)[1] for line in text.splitlines() if line.startswith(f"[node {node}] tick ")]


def test_follow_through_a_dropped_login_connection_misses_and_repeats_no_line(
        orch: Orch, slurm2: SlurmCluster, sshd: SSHServer, tmp_path: Path) -> None:
    """A 2-node job's merged log, followed through a login-node link that is cut mid-stream:
    the follower reconnects and each node's lines arrive once, in order."""
    proxy = FaultProxy(sshd.port)
    try:
        lab2 = add_lab(orch, SlurmLogin(proxy.port, sshd.client_key, slurm2), "flakylab")
        spec = job_file(tmp_path, "ticks", f"hosts: [{lab2}]\nlaunch:\n  nnodes: 2\n  nproc_per_node: 1\n"
                                           "  command: python job.py 150\n", script=TICKS)
        job = orch.json("submit", str(spec))["job_id"]
        printed = tmp_path / "follow.out"
        with open(printed, "w") as sink:
            follower = subprocess.Popen([sys.executable, "-m", "orchestrator", "logs", job, "-f"], cwd=orch.cwd,
                                        env={**orch.env, "ORCH_LOG_HEARTBEAT_S": "0.5", "ORCH_KEEPALIVE_S": "1"},
                                        stdout=sink, stderr=subprocess.PIPE, text=True)
        wait_until(lambda: "tick 0010" in ticks(printed.read_text(), 0),
                   what="the follower to print line 10 of node 0", timeout=WAIT_S)
        proxy.cut()
        _, err = follower.communicate(timeout=300)
    finally:
        proxy.close()
    assert follower.returncode == 0, err
    assert "reconnecting" in err, err
    out = printed.read_text()
    for node in (0, 1):
        assert ticks(out, node) == [f"tick {i:04d}" for i in range(150)], (node, out[-2000:])
    assert orch.json("status", job)["state"] == "succeeded"


def test_a_login_node_without_all_of_slurms_clients_is_named_before_anything_is_sent(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    """hello's cluster facts: every client orch runs is looked for; the missing ones are named."""
    from remote_payload.slurm import job as slurmjob

    found = slurmjob.host_facts(slurm.env, str(tmp_path))
    assert found["partitions"]["debug"]["max_gpus_per_node"] == 2 and "problem" not in found
    partial = tmp_path / "bin"
    partial.mkdir()
    for client in ("sbatch", "sinfo", "squeue", "scontrol"):
        (partial / client).symlink_to(shutil.which(client))
    said = slurmjob.host_facts({**slurm.env, "PATH": str(partial)}, str(tmp_path))
    assert said == {"problem": "srun, scancel not found on PATH: is this a Slurm login node?"}

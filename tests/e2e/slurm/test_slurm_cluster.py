"""The Slurm test clusters themselves (tests/support/slurm.py): batch jobs and srun steps on one
node and across two namespaces, pending reasons, scancel, exit codes, fake GPUs, the
login node over ssh, no accounting, and a teardown that leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.poll import wait_until
from tests.support.slurm import SACCT_DISABLED, WAIT_S, SlurmCluster, SlurmLogin, short_hostname, start_slurm

TIMEOUT = WAIT_S


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def reason(cluster: SlurmCluster, job_id: str) -> str:
    """``squeue -o %r`` of a job, once the scheduler has looked at it ('' before)."""
    out = cluster.run("squeue", "-h", "-j", job_id, "-o", "%T %r").stdout.split()
    return out[1] if len(out) == 2 and out[1] != "None" else ""


def test_batch_job_runs_srun_on_this_machine(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = slurm.sbatch(f"#!/bin/sh\nsrun hostname > {tmp_path}/hosts\necho done\n",
                       "-o", str(tmp_path / "slurm-%j.out"), "-J", "hello")
    info = slurm.wait_job(job, timeout=TIMEOUT)
    assert (info["JobState"], info["ExitCode"], info["NodeList"]) == ("COMPLETED", "0:0", short_hostname())
    assert (tmp_path / "hosts").read_text().split() == [short_hostname()]
    assert (tmp_path / f"slurm-{job}.out").read_text() == "done\n"


def test_two_node_job_runs_a_task_in_each_namespace(slurm2: SlurmCluster, tmp_path: Path) -> None:
    job = slurm2.sbatch(f"#!/bin/sh\nsrun --ntasks-per-node=1 sh -c 'echo $(hostname) $(hostname -i)' > {tmp_path}/hosts\n"
                        f"echo $SLURM_JOB_NODELIST $SLURM_NNODES > {tmp_path}/env\n",
                        "-N", "2", "-o", str(tmp_path / "slurm-%j.out"))
    info = slurm2.wait_job(job, timeout=TIMEOUT)
    assert (info["JobState"], info["NodeList"], info["BatchHost"]) == ("COMPLETED", "node[1-2]", "node1")
    lines = sorted(line.split() for line in (tmp_path / "hosts").read_text().splitlines())
    assert [name for name, _ in lines] == ["node1", "node2"]
    assert [addr for _, addr in lines] == [n.address for n in slurm2.nodes]  # each its own network
    assert (tmp_path / "env").read_text().split() == ["node[1-2]", "2"]


def test_two_node_job_gets_fake_gpus_on_each_node(slurm2: SlurmCluster, tmp_path: Path) -> None:
    job = slurm2.sbatch(f"#!/bin/sh\nsrun --ntasks-per-node=1 sh -c 'echo $(hostname) $CUDA_VISIBLE_DEVICES'"
                        f" > {tmp_path}/gpus\n", "-N", "2", "--gres=gpu:2", "-o", "/dev/null")
    assert slurm2.wait_job(job, timeout=TIMEOUT)["JobState"] == "COMPLETED"
    assert sorted((tmp_path / "gpus").read_text().splitlines()) == ["node1 0,1", "node2 0,1"]


def test_fake_gpus_are_scheduled_and_handed_out_apart(slurm: SlurmCluster, tmp_path: Path) -> None:
    hold = f"while [ ! -e {tmp_path}/release ]; do sleep 0.2; done"
    a, b = (slurm.sbatch(f"#!/bin/sh\nsrun sh -c 'echo $CUDA_VISIBLE_DEVICES' > {tmp_path}/{name}.tmp\n"
                         f"mv {tmp_path}/{name}.tmp {tmp_path}/{name}\n{hold}\n", "--gres=gpu:1", "-o", "/dev/null")
            for name in ("a", "b"))
    wait_until(lambda: (tmp_path / "a").exists() and (tmp_path / "b").exists(),
               what="both 1-GPU jobs to start", timeout=WAIT_S)
    assert {(tmp_path / "a").read_text().strip(), (tmp_path / "b").read_text().strip()} == {"0", "1"}
    c = slurm.sbatch("#!/bin/sh\ntrue\n", "--gres=gpu:1", "-o", "/dev/null")
    assert wait_until(lambda: reason(slurm, c), what="a reason for the third GPU job", timeout=WAIT_S) == "Resources"
    assert slurm.job(c)["JobState"] == "PENDING"
    (tmp_path / "release").touch()
    for job in (a, b, c):
        assert slurm.wait_job(job, timeout=TIMEOUT)["JobState"] == "COMPLETED"
    too_many = slurm.run("sbatch", "--gres=gpu:3", check=False, input="#!/bin/sh\ntrue\n")
    assert too_many.returncode == 1
    assert "Requested node configuration is not available" in too_many.stderr


def test_jobs_bigger_than_the_cluster_pend_or_are_rejected(slurm: SlurmCluster, slurm2: SlurmCluster,
                                                           tmp_path: Path) -> None:
    # More nodes or CPUs than the whole partition has: accepted (EnforcePartLimits=NO, the
    # default) and PENDING for good, the reason PartitionConfig or PartitionNodeLimit
    # (which one depends on the scheduler pass that saw it last).
    limits = ("PartitionConfig", "PartitionNodeLimit")
    for cluster in (slurm, slurm2):
        for args in (["-N", str(len(cluster.nodes) + 1)], ["-n", str(cluster.cpus * len(cluster.nodes) + 1)]):
            job = cluster.sbatch("#!/bin/sh\ntrue\n", *args, "-o", "/dev/null")
            assert wait_until(lambda: reason(cluster, job), what="a pending reason", timeout=WAIT_S) in limits, args
            info = cluster.job(job)
            assert info["JobState"] == "PENDING" and info["Reason"] in limits, (args, info)
            cluster.run("scancel", job)
    # Within the partition's totals but more CPUs, memory or GPUs than any one node has:
    # refused by sbatch.
    for cluster, args in ((slurm2, ["-c", str(slurm2.cpus + 1)]), (slurm, ["--mem", "999999999"]),
                          (slurm2, ["--mem", "999999999"]), (slurm, ["--gres=gpu:3"]), (slurm2, ["--gres=gpu:3"])):
        refused = cluster.run("sbatch", *args, check=False, input="#!/bin/sh\ntrue\n")
        assert refused.returncode == 1, args
        assert "Batch job submission failed: Requested node configuration is not available" in refused.stderr
    # Fits the cluster but not now: PENDING (Resources) until the running job ends.
    busy = slurm.sbatch(f"#!/bin/sh\ntouch {tmp_path}/busy\nwhile [ ! -e {tmp_path}/release ]; do sleep 0.2; done\n",
                        "-n", str(slurm.cpus), "-o", "/dev/null")
    wait_until((tmp_path / "busy").exists, what="the job holding every CPU to start", timeout=WAIT_S)
    waiting = slurm.sbatch("#!/bin/sh\ntrue\n", "-n", "1", "-o", "/dev/null")
    assert wait_until(lambda: reason(slurm, waiting), what="a pending reason", timeout=WAIT_S) == "Resources"
    (tmp_path / "release").touch()
    assert slurm.wait_job(busy, timeout=TIMEOUT)["JobState"] == "COMPLETED"
    assert slurm.wait_job(waiting, timeout=TIMEOUT)["JobState"] == "COMPLETED"


def test_scancel_terms_then_ends_every_process_of_the_job(slurm2: SlurmCluster, tmp_path: Path) -> None:
    job = slurm2.sbatch(
        f"#!/bin/bash\ntrap 'echo term > {tmp_path}/term; exit 143' TERM\n"
        f"srun --ntasks-per-node=1 bash -c 'echo $$ > {tmp_path}/pid.$(hostname); exec sleep 300' &\nwait\n",
        "-N", "2", "-o", "/dev/null")
    def task_pids() -> list[int]:
        texts = [p.read_text().strip() for p in tmp_path.glob("pid.*")]
        return [int(t) for t in texts] if len(texts) == 2 and all(texts) else []

    pids = wait_until(task_pids, what="a task on each node", timeout=WAIT_S)
    assert slurm2.job(job)["JobState"] == "RUNNING" and all(alive(pid) for pid in pids)
    slurm2.run("scancel", job)
    info = slurm2.wait_job(job, timeout=TIMEOUT)
    assert info["JobState"] == "CANCELLED"
    wait_until(lambda: not any(alive(pid) for pid in pids), what="the tasks to end", timeout=30)
    assert (tmp_path / "term").read_text() == "term\n"  # the batch script had its SIGTERM


def test_exit_code_and_the_job_record_without_accounting(slurm: SlurmCluster, tmp_path: Path) -> None:
    job = slurm.sbatch("#!/bin/sh\nexit 3\n", "-o", "/dev/null")
    info = slurm.wait_job(job, timeout=TIMEOUT)
    assert (info["JobState"], info["ExitCode"], info["Reason"]) == ("FAILED", "3:0", "NonZeroExitCode")
    # No slurmdbd: sacct refuses; the finished job stays in scontrol/squeue -t all for MinJobAge.
    sacct = slurm.run("sacct", "-j", job, check=False)
    assert sacct.returncode == 1 and SACCT_DISABLED in sacct.stderr
    assert slurm.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T").stdout.split() == ["FAILED"]


def test_login_node_over_ssh_submits_and_queries(slurm_login: SlurmLogin, tmp_path: Path) -> None:
    job = slurm_login(f"sbatch --parsable -o {tmp_path}/out -N1 --wrap 'srun hostname'").stdout.strip()
    assert job.isdigit()
    assert slurm_login.cluster.wait_job(job, timeout=TIMEOUT)["JobState"] == "COMPLETED"
    assert (tmp_path / "out").read_text().split() == [short_hostname()]
    state = slurm_login(f"squeue -h -t all -j {job} -o %T").stdout.split()
    assert state == ["COMPLETED"]
    if not Path("/etc/slurm/slurm.conf").exists():  # without the prefix a login shell knows no cluster
        bare = subprocess.run([*slurm_login.ssh, "sinfo"], capture_output=True, text=True, timeout=60)
        assert bare.returncode != 0


def test_two_node_cluster_through_the_login_node(slurm2_login: SlurmLogin, tmp_path: Path) -> None:
    job = slurm2_login(f"sbatch --parsable -o {tmp_path}/out -N2 --wrap 'srun --ntasks-per-node=1 hostname'").stdout
    assert slurm2_login.cluster.wait_job(job.strip(), timeout=TIMEOUT)["JobState"] == "COMPLETED"
    assert sorted((tmp_path / "out").read_text().split()) == ["node1", "node2"]


def _processes_of(cluster: SlurmCluster) -> list[int]:
    marks = {f"SLURM_CONF={cluster.conf}".encode(), f"SLURM_CLUSTER_NAME={cluster.name}".encode()}
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marks & set((entry / "environ").read_bytes().split(b"\0")) \
                    and alive(int(entry.name)):
                pids.append(int(entry.name))
        except OSError:
            pass
    return pids


@pytest.mark.slurm
@pytest.mark.netns
def test_teardown_leaves_nothing_behind(tmp_path: Path) -> None:
    cluster = start_slurm(Path(f"/tmp/orch-slurm-teardown-{os.getpid()}"), netns=2)
    try:
        job = cluster.sbatch(f"#!/bin/sh\nsrun --ntasks-per-node=1 sleep 300 &\ntouch {tmp_path}/started\nwait\n",
                             "-N", "2", "-o", "/dev/null")
        cluster.wait_job(job, ("RUNNING",), timeout=TIMEOUT)
        wait_until(lambda: len(_processes_of(cluster)) >= 5,
                   what="the step", timeout=WAIT_S)  # daemons, stepds, script, sleeps
        for node in cluster.nodes:  # slurmd gone first: its job processes live on
            node.proc.kill()
            node.proc.wait()
    finally:
        cluster.teardown()
    assert _processes_of(cluster) == []
    assert all(p.poll() is not None for p in cluster.procs.values())
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(node.ns in namespaces for node in cluster.nodes)
    links = subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert cluster.bridge and cluster.bridge not in links
    assert not cluster.workdir.exists()
    assert not any(Path(f"/etc/netns/{node.ns}").exists() for node in cluster.nodes)


@pytest.mark.slurm
def test_a_daemon_that_fails_to_start_is_reported_with_its_log() -> None:
    with pytest.raises(RuntimeError) as failed:
        start_slurm(extra_conf="SelectType=select/nonesuch", timeout=30)
    assert "slurmctld exited" in str(failed.value)
    assert "select/nonesuch" in str(failed.value)

"""The laptop side of Slurm, as pure logic: no cluster, no sshd. Cluster facts come from the
real ``cluster_facts`` parser fed a canned ``sinfo`` answer; CLI checks run the real ``orch``."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
from pydantic import ValidationError

from orchestrator.checks import slurm as slurmcheck
from orchestrator.checks.verdict import FAIL, OK, WARN, Row
from orchestrator.errors import RemoteError, UsageError
from orchestrator.hosts.inventory import Host, Inventory
from orchestrator.jobs.logs import log_hosts
from orchestrator.plan import slurm as slurmplan
from orchestrator.plan.build import HostFacts, Plan, build_plan
from orchestrator.spec.model import JobSpec
from orchestrator.state.registry import JobRecord
from remote_payload.contract.slurm import RDZV
from remote_payload.slurm import clients as slurm
from tests.support.orch import Orch

JOB = "t-20261129-101500-abcd"
PY = "/usr/bin/python3"
ROOT = "/shared/orch"
JOB_DIR = f"{ROOT}/jobs/{JOB}"
# gpu (default): 2 nodes × 4 GPUs, 2 days; cpu: 8 nodes without GPUs, 1 hour.
SINFO = "gpu*|2|up|2-00:00:00|gpu:a100:4(S:0-1)|64|512000\ncpu|8|up|1:00:00|(null)|32|128000\n"


def cluster_facts(**extra: Any) -> dict[str, Any]:
    """What ``hello`` reports for the cluster above (``slurmjob.host_facts``' shape)."""
    answers = {"sinfo -h": (0, SINFO, ""), "sinfo --version": (0, "slurm 22.05.8\n", "")}
    with patch.object(slurm, "_run", lambda argv, env: answers.get(" ".join(argv[:2]), (1, "", "no accounting"))):
        facts = slurm.cluster_facts()
    return {**facts, "root_fs": "nfs", **extra}


FACTS = cluster_facts()
LAB = Host(name="lab", address="login.lab", user="u", scheduler="slurm", root=ROOT,
           slurm_env={"SLURM_CONF": "/etc/slurm/lab.conf"})
BOX = Host(name="box", address="203.0.113.7")


def spec(hosts: tuple[str, ...] = ("lab",), on_finish: dict[str, Any] | None = None, **launch: Any) -> JobSpec:
    return JobSpec.model_validate({"name": "t", "hosts": list(hosts), "on_finish": on_finish or {},
                                   "launch": {"command": ["python", "train.py"], **launch}})


def facts(payload: str = ROOT + "/payload", **slurm_facts: Any) -> HostFacts:
    return HostFacts(python=PY, root=ROOT, payload=payload, slurm={**FACTS, **slurm_facts})


def plan(job: JobSpec, host: Host = LAB, fact: HostFacts | None = None) -> Plan:
    return build_plan(job, "text", "/laptop/proj", "proj", [host], [fact or facts()], JOB)


def test_the_canned_cluster_has_the_shape_the_tests_assume() -> None:
    assert FACTS["partitions"]["gpu"] == {"nodes": 2, "state": "up", "max_time": "2-00:00:00", "max_time_s": 172800,
                                          "default": True, "max_gpus_per_node": 4,
                                          "groups": [{"nodes": 2, "gpus": 4, "cpus": 64, "mem_mb": 512000}]}
    assert FACTS["partitions"]["cpu"]["max_gpus_per_node"] == 0 and FACTS["version"] == "22.05.8"
    assert FACTS["accounting"] is False


# 1. GPUs per node and processes per node

@pytest.mark.parametrize("launch, partition, expected", [
    ({"nproc_per_node": 2, "slurm": {"gpus_per_node": 3}}, "gpu", (3, 2)),  # explicit GPUs win
    ({"nproc_per_node": 2}, "gpu", (2, 2)),                                 # one GPU per process
    ({"nproc_per_node": 2}, "cpu", (0, 2)),                                 # a CPU partition: no --gres
    ({"nproc_per_node": "auto"}, "gpu", (4, 4)),                            # every GPU, one process each
    ({"nproc_per_node": "auto"}, "cpu", (0, 1)),                            # one process without GPUs
    ({"nproc_per_node": "auto"}, None, (4, 4)),                             # the default partition (gpu)
    ({"nproc_per_node": 3}, None, (3, 3)),
])
def test_gpus_and_processes_per_node(launch: dict[str, Any], partition: str | None, expected: tuple[int, int]) -> None:
    assert slurmplan.gpus_and_nproc(spec(**launch), FACTS, partition) == expected


def test_more_processes_than_the_gpus_asked_for_is_a_usage_error() -> None:
    with pytest.raises(UsageError) as err:
        slurmplan.gpus_and_nproc(spec(nproc_per_node=4, slurm={"gpus_per_node": 2}), FACTS, "gpu")
    assert str(err.value) == ("launch.nproc_per_node is 4 but the job asks Slurm for 2 GPU(s) per node "
                              "(launch.slurm.gpus_per_node)")


# 2. What a job cannot ask of its hosts

@pytest.mark.parametrize("hosts, job, message", [
    ([LAB, BOX], spec(("lab", "box")), "lab is a Slurm cluster: list it alone in hosts (launch.nnodes says"),
    ([LAB], spec(rdzv_port=29500), "launch.rdzv_port does not apply on Slurm"),
    ([LAB], spec(rdzv_host="10.0.0.1"), "launch.rdzv_host does not apply on Slurm"),
    ([LAB], spec(on_finish={"shutdown": True}), "on_finish.shutdown: lab is a Slurm cluster, which orch never powers"),
    ([BOX], spec(("box",), nnodes=2), "launch.nnodes is 2 but the job lists 1 SSH host(s), one node each"),
])
def test_refusals_name_the_field(hosts: list[Host], job: JobSpec, message: str) -> None:
    with pytest.raises(UsageError) as err:
        slurmplan.refusals(job, hosts)
    assert str(err.value).startswith(message), str(err.value)


@pytest.mark.parametrize("hosts, job", [
    ([LAB], spec(nnodes=4, slurm={"time": "30"})),
    ([BOX], spec(("box",), nnodes=1)),
    ([BOX, Host(name="box2", address="h2")], spec(("box", "box2"), nnodes=2, rdzv_port=29500)),
])
def test_refusals_let_valid_jobs_through(hosts: list[Host], job: JobSpec) -> None:
    assert slurmplan.refusals(job, hosts) is None


# 3. The plan on a Slurm host

def test_a_two_node_plan_is_torchrun_with_the_rendezvous_left_to_the_allocation() -> None:
    p = plan(spec(nnodes=2, slurm={"time": "1:00:00", "requeue": True}))
    argv = [PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "4", "--rdzv_backend", "c10d",
            "--rdzv_endpoint", RDZV, "--rdzv_id", JOB, "--rdzv_conf", "join_timeout=300", "--max_restarts", "0",
            "--no-python", PY, "train.py"]
    assert RDZV == "@rdzv@"
    assert [(n.host, n.node_rank, n.nproc, n.job_dir, n.argv, n.direct) for n in p.nodes] == [
        ("lab", 0, 4, JOB_DIR, argv, False), ("lab", 1, 4, JOB_DIR, argv, False)]
    assert p.job_dir == JOB_DIR and p.root == ROOT
    assert p.slurm is not None and p.slurm["env"] == {"SLURM_CONF": "/etc/slurm/lab.conf"}
    assert p.slurm["resources"] == {"nodes": 2, "gpus_per_node": 4, "cpus_per_task": None, "mem": None,
                                    "time": "1:00:00", "partition": None, "account": None, "qos": None,
                                    "requeue": True, "signal_before_s": 120, "job_name": JOB}
    assert p.slurm["script"].splitlines() == [
        "#!/bin/bash", f"#SBATCH --job-name={JOB}", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gres=gpu:4", "#SBATCH --time=1:00:00", "#SBATCH --requeue", "#SBATCH --signal=B:USR1@120",
        f"#SBATCH --output={JOB_DIR}/logs/slurm-%j.out", f"#SBATCH --error={JOB_DIR}/logs/slurm-%j.out",
        "#SBATCH --open-mode=append", f"#SBATCH --chdir={JOB_DIR}",
        f"exec {PY} {ROOT}/payload/remote_payload/supervisor/supervisor.py --job-dir {JOB_DIR} --node-rank 0"]


def test_one_node_is_standalone_and_launch_slurm_overrides_the_host() -> None:
    host = LAB.model_copy(update={"partition": "gpu", "account": "proj", "qos": "normal"})
    p = plan(spec(nproc_per_node=2, slurm={"partition": "cpu", "account": "other", "mem": "64G"}), host)
    assert [n.argv for n in p.nodes] == [[PY, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                                          "--nproc_per_node", "2", "--max_restarts", "0", "--no-python", PY, "train.py"]]
    assert p.slurm is not None
    res = p.slurm["resources"]
    assert (res["nodes"], res["gpus_per_node"], res["partition"], res["account"], res["qos"], res["mem"]) == \
        (1, 0, "cpu", "other", "normal", "64G")
    script = p.slurm["script"]
    assert "#SBATCH --nodes=1\n" in script and "--gres" not in script and "#SBATCH --no-requeue\n" in script
    assert "#SBATCH --partition=cpu\n#SBATCH --account=other\n#SBATCH --qos=normal\n" in script


def test_one_node_one_process_with_launcher_auto_runs_the_program_directly() -> None:
    p = plan(spec(nproc_per_node=1, slurm={"signal_before_s": 0}))
    assert [(n.argv, n.direct, n.nproc) for n in p.nodes] == [([PY, "train.py"], True, 1)]
    assert p.slurm is not None and "--signal" not in p.slurm["script"] and "#SBATCH --gres=gpu:1\n" in p.slurm["script"]


def test_a_slurm_plan_needs_to_know_where_the_helper_lives() -> None:
    with pytest.raises(UsageError, match="^lab: the helper did not say where it lives"):
        plan(spec(), fact=facts(payload=""))


def test_a_slurm_host_never_arms_the_idle_shutdown_guard() -> None:
    """BUG: a Slurm host with idle_shutdown_minutes is accepted and the minutes reach
    plan.on_finish, so the supervisor (the batch script's process) keeps the allocation for
    that long after the job ends, then runs `shutdown -h now` on a compute node. Refusing it
    (Host or build_plan) or dropping it from the plan all pass this test."""
    with contextlib.suppress(ValidationError, UsageError):
        host = LAB.model_copy(update={"idle_shutdown_minutes": 30.0})
        host = Host.model_validate(host.model_dump())
        assert plan(spec(), host).on_finish["idle_shutdown_minutes"] is None


# 4. launch.slurm and launch.nnodes in a job file, through `orch check`

HEAD = "name: ok\nhosts: [local]\nlaunch:\n  command: [x]\n"


@pytest.mark.parametrize("text, expected", [
    (HEAD + "  slurm:\n    time: soon\n",
     "job.yaml:6:11: launch.slurm.time: bad Slurm time 'soon' (minutes, M:S, H:M:S or D-H:M:S)"),
    (HEAD + "  slurm:\n    mem: lots\n", "job.yaml:6:10: launch.slurm.mem: bad memory 'lots' (a number with K, M, G or T)"),
    (HEAD + "  slurm:\n    time: '5'\n    signal_before_s: 300\n",
     "job.yaml:7:22: launch.slurm.signal_before_s: signal_before_s (300) must be shorter than the time limit 5 (300 s)"),
    (HEAD + "  slurm:\n    tme: '5'\n", "job.yaml:6:5: launch.slurm.tme: unknown field (did you mean 'time'?)"),
    ("name: ok\nhosts: [local, box]\nlaunch:\n  command: [x]\n  nnodes: 3\n",
     "job.yaml:5:11: launch.nnodes: launch.nnodes is 3 but 2 hosts are listed"),
])
def test_bad_slurm_fields_are_exit_2_with_file_line_col(orch: Orch, text: str, expected: str) -> None:
    path = orch.cwd / "job.yaml"
    path.write_text(text)
    err = orch("check", str(path), check=2).stderr
    assert f"{orch.cwd}/{expected}" in err and "Traceback" not in err, err


def test_a_valid_slurm_section_passes_check(orch: Orch) -> None:
    path = orch.cwd / "job.yaml"
    path.write_text(HEAD + "  nnodes: 1\n  slurm: {time: '1-00:00:00', mem: 64G, gpus_per_node: 4, requeue: true}\n")
    assert f"{path}: ok" in orch("check", str(path)).stdout


# 5. The host model and `orch hosts add`

@pytest.mark.parametrize("field, value", [("partition", "gpu"), ("account", "proj"), ("qos", "normal"),
                                          ("slurm_env", {"SLURM_CONF": "/x"})])
def test_slurm_fields_on_an_ssh_host_are_refused(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match="partition, account, qos and slurm_env are for a Slurm host"):
        Host(name="box", address="h", **{field: value})


@pytest.mark.parametrize("fields", [{"partition": "gpu queue"}, {"partition": "gpu\n"}, {"partition": ""},
                                    {"account": "a;b"}, {"slurm_env": {"1BAD": "x"}}])
def test_bad_slurm_values_on_a_slurm_host_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Host(name="lab", address="h", scheduler="slurm", **fields)


def test_hosts_add_saves_a_slurm_entry_without_connecting(orch: Orch) -> None:
    out = orch("hosts", "add", "lab", "--ssh", "ssh u@h", "--scheduler", "slurm", "--partition", "gpu",
               "--slurm-env", "SLURM_CONF=/x")
    assert "saved lab: u@h:22, root ~/orch (Slurm login node)" in out.stderr
    entry = json.loads((orch.home / "hosts" / "lab.json").read_text())
    assert {k: entry[k] for k in ("address", "user", "scheduler", "partition", "account", "qos", "slurm_env")} == {
        "address": "h", "user": "u", "scheduler": "slurm", "partition": "gpu", "account": None, "qos": None,
        "slurm_env": {"SLURM_CONF": "/x"}}


@pytest.mark.parametrize("extra, message", [
    (("--scheduler", "slurm", "--slurm-env", "NOEQUALS"), "--slurm-env wants NAME=VALUE (like SLURM_CONF="),
    (("--partition", "gpu"), "invalid host: partition, account, qos and slurm_env are for a Slurm host (--scheduler slurm)"),
])
def test_hosts_add_refuses_bad_slurm_options(orch: Orch, extra: tuple[str, ...], message: str) -> None:
    err = orch("hosts", "add", "lab", "--ssh", "ssh u@h", *extra, check=2).stderr
    assert message in err and "Traceback" not in err, err
    assert not (orch.home / "hosts" / "lab.json").exists()


# 6. Checks against the cluster's facts

def test_a_request_the_cluster_can_never_run_is_a_remote_error() -> None:
    job = spec(nnodes=5)
    with pytest.raises(RemoteError) as err:
        slurmcheck.job_problems(job, [LAB], [{"slurm": FACTS}], plan(job))
    assert err.value.exit_code == 4
    assert str(err.value) == ("lab: Slurm could never run this job: it asks for 5 nodes but partition gpu has 2. "
                              "Change launch.nnodes, launch.nproc_per_node or launch.slurm (see `orch hosts check "
                              "lab` for the partitions)")


@pytest.mark.parametrize("slurm_job, problem", [
    ({"partition": "big"}, "Slurm could never run this job: partition big does not exist (partitions: cpu, gpu)."),
    ({"partition": "cpu", "time": "2:00:00"}, "it asks for time 2:00:00 but partition cpu allows at most 1:00:00."),
    ({"gpus_per_node": 8}, "it asks for 8 GPUs per node but the nodes of partition gpu have at most 4."),
])
def test_each_kind_of_unfittable_request_is_named(slurm_job: dict[str, Any], problem: str) -> None:
    job = spec(nproc_per_node=1, slurm=slurm_job)
    with pytest.raises(RemoteError, match="^lab: ") as err:
        slurmcheck.job_problems(job, [LAB], [{"slurm": FACTS}], plan(job))
    assert problem in str(err.value)


def test_a_cluster_slurm_cannot_be_asked_about_is_a_remote_error() -> None:
    with pytest.raises(RemoteError, match="^lab: cannot ask Slurm: sinfo not found \\(on a cluster that needs"):
        slurmcheck.cluster(LAB, {"slurm": {"problem": "sinfo not found"}})
    with pytest.raises(RemoteError, match="^lab: the helper did not describe the Slurm cluster"):
        slurmcheck.cluster(LAB, {})


@pytest.mark.parametrize("root_fs, warned", [("nfs", False), ("lustre", False), ("ext4", True), ("", True)])
def test_a_root_not_on_a_shared_filesystem_is_warned_about(root_fs: str, warned: bool) -> None:
    job = spec()
    warnings = slurmcheck.job_problems(job, [LAB], [{"slurm": {**FACTS, "root_fs": root_fs}}], plan(job))
    kind = root_fs or "unknown"
    assert warnings == ([f"lab: orch's root {ROOT} is on a {kind} filesystem, not one compute nodes usually share "
                         "(NFS, Lustre, GPFS, ...): jobs read their code and write checkpoints there — choose a root "
                         "on the shared filesystem (orch hosts add ... --root) unless you know the nodes see it"]
                        if warned else [])


def test_launch_slurm_on_an_ssh_host_is_only_a_warning() -> None:
    box_facts = HostFacts(python=PY, root="/root/orch", gpus=1)
    for job, expected in ((spec(("box",), slurm={"time": "30"}), ["launch.slurm applies to Slurm hosts only: "
                                                                  "ignored on box"]), (spec(("box",)), [])):
        p = build_plan(job, "text", "/laptop/proj", "proj", [BOX], [box_facts], JOB)
        assert slurmcheck.job_problems(job, [BOX], [{}], p) == expected


def test_preflight_rows_for_a_job_that_fits() -> None:
    rows = slurmcheck.preflight_rows(LAB, FACTS, spec(nnodes=2))
    assert rows == [
        Row("slurm", "22.05.8, accounting off (states from scontrol/squeue)", OK),
        Row("partition", "gpu (default): 2 × 4 GPU, 64 CPU, 500 GiB, max time 2-00:00:00", OK),
        Row("partition", "cpu: 8 × 0 GPU, 32 CPU, 125 GiB, max time 1:00:00", OK),
        Row("shared root", f"{ROOT} on nfs", OK),
        Row("job request", "2 node(s) × 4 process(es), 4 GPU(s)/node, time partition default", OK)]


@pytest.mark.parametrize("job, expected", [
    (spec(nnodes=5), Row("job request", "5 node(s) × 4 process(es), 4 GPU(s)/node, time partition default", FAIL,
                         "asks for 5 nodes but partition gpu has 2")),
    (spec(nproc_per_node=4, slurm={"gpus_per_node": 2}), Row("job request", "invalid", FAIL, (
        "launch.nproc_per_node is 4 but the job asks Slurm for 2 GPU(s) per node (launch.slurm.gpus_per_node)"))),
])
def test_preflight_rows_fail_a_request_the_cluster_cannot_take(job: JobSpec, expected: Row) -> None:
    assert slurmcheck.preflight_rows(LAB, FACTS, job)[-1] == expected


def test_preflight_rows_for_an_unanswering_cluster_and_a_down_partition() -> None:
    assert slurmcheck.preflight_rows(LAB, {"problem": "sinfo not found"}, None) == [
        Row("slurm", "not answering", FAIL, "sinfo not found")]
    down = {**FACTS, "root_fs": "ext4", "partitions": {"gpu": {**FACTS["partitions"]["gpu"], "state": "down"}}}
    rows = slurmcheck.preflight_rows(LAB, down, None)
    assert [(r.check, r.verdict, r.note) for r in rows] == [
        ("slurm", OK, ""), ("partition", WARN, "state down"),
        ("shared root", WARN, "compute nodes must see this folder")]


# 7. Which host serves each node log

@pytest.fixture
def inventory(tmp_path: Path) -> Inventory:
    inv = Inventory(tmp_path)
    inv.save(BOX)
    return inv


def record(hosts: list[str], detail: dict[str, Any]) -> JobRecord:
    return JobRecord(JOB, "t", "job.yaml", hosts, JOB_DIR, 0.0, "running", detail)


def test_log_hosts_repeats_a_slurm_host_for_each_node(inventory: Inventory) -> None:
    assert [h.name for h in log_hosts(record(["local"], {"log_nodes": 3}), inventory)] == ["local"] * 3
    assert [h.name for h in log_hosts(record(["local", "box"], {"log_nodes": 3}), inventory)] == ["local", "box"]


@pytest.mark.parametrize("junk", ["3", 0, 1, -2, 10**9, None, 2.0])
def test_log_hosts_ignores_a_junk_node_count(inventory: Inventory, junk: Any) -> None:
    assert [h.name for h in log_hosts(record(["box"], {"log_nodes": junk}), inventory)] == ["box"]

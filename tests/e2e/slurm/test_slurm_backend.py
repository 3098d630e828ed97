"""remote_payload/slurm/clients.py, the Slurm layer of issue 13: pure parts (script text, validation,
parsing, the state table) without Slurm, the rest against the real test clusters of
tests/support/slurm.py (``slurm``: one node, ``slurm2``: node1 + node2; 2 fake GPUs per node)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Optional

import pytest

from remote_payload.contract import slurm as R
from remote_payload.contract.protocol import CANCELLED, FAILED, LOST, PENDING, RUNNING, SUCCEEDED, UNKNOWN
from remote_payload.slurm import clients as S
from tests.support.poll import wait_until
from tests.support.slurm import ENDED, WAIT_S, SlurmCluster, short_hostname

TIMEOUT = WAIT_S


def make_job_dir(tmp_path: Path, name: str = "job") -> str:
    (tmp_path / name / "logs").mkdir(parents=True)
    return str(tmp_path / name)


def submit(cluster: SlurmCluster, res: R.Resources, job_dir: str, argv: list[str]) -> str:
    script = Path(job_dir) / f"{res.job_name}.sbatch"
    script.write_text(R.batch_script(res, job_dir, argv))
    return S.submit(str(script), env=cluster.env)


def hold(tmp_path: Path, name: str) -> str:
    """Shell: mark ``<name>.started``, then wait for ``<name>.release``."""
    return f"touch {tmp_path}/{name}.started; while [ ! -e {tmp_path}/{name}.release ]; do sleep 0.2; done"


def state_of(cluster: SlurmCluster, job: str, states: tuple[str, ...] = ENDED, timeout: float = TIMEOUT) -> R.Info:
    def probe() -> Optional[R.Info]:
        info = S.query(job, cluster.env)
        return info if info and info.state in states else None
    return wait_until(probe, what=f"job {job} in {states}", timeout=timeout)


def reason_of(cluster: SlurmCluster, job: str) -> R.Info:
    """The job once the scheduler has given it a reason."""
    def probe() -> Optional[R.Info]:
        info = S.query(job, cluster.env)
        return info if info and info.reason else None
    return wait_until(probe, what=f"a pending reason for job {job}", timeout=WAIT_S)


# -- the batch script and srun, pure ------------------------------------------------------
FULL = R.Resources(nodes=2, gpus_per_node=4, cpus_per_task=8, mem="64G", time="1-12:00:00", partition="gpu",
                   account="proj123", qos="high", requeue=True, signal_before_s=300, job_name="train-20260101-1200-ab12")


def test_batch_script_for_full_resources_is_exact() -> None:
    argv = ["/usr/bin/python3", "supervisor.py", "it's", "$HOME; rm -rf / #", "a\nb"]
    text = R.batch_script(FULL, "/shared/orch/jobs/train-1/", argv)
    assert text == """\
#!/bin/bash
#SBATCH --job-name=train-20260101-1200-ab12
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:4
#SBATCH --cpus-per-task=8
#SBATCH --mem=64G
#SBATCH --time=1-12:00:00
#SBATCH --partition=gpu
#SBATCH --account=proj123
#SBATCH --qos=high
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --output=/shared/orch/jobs/train-1/logs/slurm-%j.out
#SBATCH --error=/shared/orch/jobs/train-1/logs/slurm-%j.out
#SBATCH --open-mode=append
#SBATCH --chdir=/shared/orch/jobs/train-1
exec /usr/bin/python3 supervisor.py 'it'"'"'s' '$HOME; rm -rf / #' 'a
b'
"""
    # bash reads back exactly the argv (a newline inside a quoted word is not a new command)
    echo = subprocess.run(["bash", "-c", "printf '%s\\0' " + text.split("\nexec ", 1)[1]], capture_output=True, text=True)
    assert echo.stdout.split("\0")[:-1] == argv


def test_batch_script_defaults() -> None:
    assert R.batch_script(R.Resources(), "/r/jobs/j", ["true"]).splitlines() == [
        "#!/bin/bash", "#SBATCH --job-name=orch", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
        "#SBATCH --no-requeue", "#SBATCH --signal=B:USR1@120", "#SBATCH --output=/r/jobs/j/logs/slurm-%j.out",
        "#SBATCH --error=/r/jobs/j/logs/slurm-%j.out", "#SBATCH --open-mode=append", "#SBATCH --chdir=/r/jobs/j",
        "exec true"]
    assert "--signal" not in R.batch_script(R.Resources(signal_before_s=0), "/r", ["true"])


@pytest.mark.parametrize("field, value", [
    ("partition", "gpu\n#SBATCH --uid=0"), ("partition", "gpu --uid=0"), ("partition", ""), ("account", "a;b"),
    ("qos", "high\r"), ("job_name", ""), ("job_name", "a\nb"), ("job_name", "x" * 129), ("job_name", None),
    ("mem", "32G\n#SBATCH --x"), ("mem", "lots"), ("mem", 32), ("time", "1:00\n#SBATCH --x"), ("time", "tomorrow"),
    ("time", "1:2:3:4"), ("nodes", 0), ("nodes", "2"), ("nodes", True), ("gpus_per_node", -1),
    ("cpus_per_task", 0), ("signal_before_s", 70000), ("requeue", "yes"),
])
def test_resources_reject_bad_values(field: str, value: object) -> None:
    with pytest.raises(ValueError) as bad:
        R.Resources(**{field: value})
    assert "\n" not in str(bad.value)


def test_warning_signal_must_come_inside_the_time_limit() -> None:
    with pytest.raises(ValueError, match="shorter than the time limit"):
        R.Resources(time="1")  # 60 s, warning 120 s before
    assert R.Resources(time="1", signal_before_s=30).time == "1"


@pytest.mark.parametrize("job_dir", ["relative/job", "/a b", "/a\n#SBATCH --uid=0", "/a%j", "/a'b", "/a$HOME",
                                     "/a\\b", "", None])
def test_job_dir_that_could_inject_is_rejected(job_dir: object) -> None:
    for build in (R.batch_script, R.srun_argv):
        with pytest.raises(ValueError) as bad:
            build(R.Resources(), job_dir, ["true"])
        assert "\n" not in str(bad.value)


def test_commands_are_checked() -> None:
    for argv in ([], ["a\0b"], [3], ["-c", "reboot"], "true"):
        for build in (R.batch_script, R.srun_argv):
            with pytest.raises(ValueError):
                build(R.Resources(), "/r", argv)
    with pytest.raises(ValueError):
        S.submit("--wrap=reboot")


def test_srun_argv_is_exact() -> None:
    assert R.srun_argv(FULL, "/shared/jobs/j", ["python", "-m", "torch.distributed.run", "x.py"]) == [
        "srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--gres=gpu:4", "--cpus-per-task=8",
        "--output=/shared/jobs/j/logs/node%n.log", "--error=/shared/jobs/j/logs/node%n.log", "--open-mode=append",
        "--export=ALL", "python", "-m", "torch.distributed.run", "x.py"]
    assert R.srun_argv(R.Resources(), "/j", ["true"])[:5] == ["srun", "--nodes=1", "--ntasks-per-node=1",
                                                              "--kill-on-bad-exit=1", "--output=/j/logs/node%n.log"]


@pytest.mark.parametrize("text, seconds", [
    ("90", 5400), ("1:30", 90), ("2:00:00", 7200), ("1-0", 86400), ("1-2:3", 93780), ("1-02:03:04", 93784),
    ("infinite", None), ("UNLIMITED", None), ("0", None)])
def test_time_seconds(text: str, seconds: Optional[int]) -> None:
    assert R.time_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "-1", "1h", "1:2:3:4", "1-", "a-1", "1:234"])
def test_time_seconds_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        R.time_seconds(text)


@pytest.mark.parametrize("gres, gpus", [
    ("gpu:2", 2), ("gpu:a100:4(S:0-1)", 4), ("gpu:a100:4(S:0,1),gpu:v100:2", 6), ("(null)", 0), ("", 0),
    ("mps:100,gpu:1", 1), ("gpu:tesla:no_consume:2", 2), ("gpu:xx", 0), (",".join(["gpu:1"] * 100), 100),
    ("\x00\xff((((,,,gpu", 0)])
def test_gres_gpus(gres: str, gpus: int) -> None:
    assert R.gres_gpus(gres) == gpus
    assert R.gres_gpus("gpu:1," * 1_000_000) < 1000  # bounded


# -- parsing Slurm's words ----------------------------------------------------------------
SCONTROL = ("JobId=7 JobName=a name JobState=FAKE UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=1 "
            "Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Requeue=0 "
            "Restarts=0 BatchFlag=1 ExitCode=3:0 RunTime=00:00:01 TimeLimit=UNLIMITED Partition=debug "
            "NodeList=node[1-2] BatchHost=node1 ReqB:S:C:T=0:0:*:* TRES=cpu=2,mem=100M,node=2,billing=2 "
            "Socks/Node=* Command=/tmp/a b/run.sh --x=1 WorkDir=/tmp/a b StdOut=/tmp/a b/%j.out Power=")


def test_parse_fields_keeps_values_with_spaces_and_equals_signs() -> None:
    f = R.parse_fields(SCONTROL)
    assert f["JobName"] == "a name"
    assert f["JobState"] == "FAKE"  # a job name can fake a later key: orch's names are [A-Za-z0-9._+-]
    assert (f["ExitCode"], f["NodeList"], f["BatchHost"], f["Partition"]) == ("3:0", "node[1-2]", "node1", "debug")
    assert f["TRES"] == "cpu=2,mem=100M,node=2,billing=2" and f["ReqB:S:C:T"] == "0:0:*:*"
    assert (f["Command"], f["WorkDir"], f["StdOut"], f["Power"]) == ("/tmp/a b/run.sh --x=1", "/tmp/a b",
                                                                      "/tmp/a b/%j.out", "")
    assert R.parse_fields("") == {} and R.parse_fields("junk without keys \x00\xff") == {}
    assert len(R.parse_fields("Key=" + "x" * 10_000_000)["Key"]) < 300_000


W, NEVER = "waiting for Slurm: ", " — it can never start as asked"
ORCH_TABLE = [
    (dict(state="PENDING", reason="Resources"), (PENDING, W + "Resources (the nodes it needs are busy)")),
    (dict(state="PENDING", reason="Priority"), (PENDING, W + "Priority (jobs with a higher priority go first)")),
    (dict(state="PENDING", reason=""), (PENDING, W + "not scheduled yet")),
    (dict(state="PENDING", reason="Dependency"), (PENDING, W + "Dependency (it waits for the jobs it depends on)")),
    (dict(state="PENDING", reason="BeginTime"), (PENDING, W + "BeginTime (its start time has not come yet)")),
    (dict(state="PENDING", reason="JobHeldUser"), (PENDING, W + "JobHeldUser (held by its user: scontrol release)")),
    (dict(state="PENDING", reason="ReqNodeNotAvail,_UnavailableNodes:node1"),
     (PENDING, W + "ReqNodeNotAvail,_UnavailableNodes:node1 (a node it needs is down, drained or reserved)")),
    (dict(state="PENDING", reason="QOSMaxGRESPerUser"), (PENDING, W + "QOSMaxGRESPerUser (a limit of its QoS is reached)")),
    (dict(state="PENDING", reason="AssocGrpGRES"), (PENDING, W + "AssocGrpGRES (a limit of its account is reached)")),
    (dict(state="PENDING", reason="SomethingNew"), (PENDING, W + "SomethingNew")),
    (dict(state="PENDING", reason="PartitionNodeLimit", partition="debug"),
     (PENDING, W + "PartitionNodeLimit (asks for more nodes than partition debug has)" + NEVER)),
    (dict(state="PENDING", reason="PartitionConfig", partition="gpu"),
     (PENDING, W + "PartitionConfig (asks for more than partition gpu has)" + NEVER)),
    (dict(state="PENDING", reason="PartitionTimeLimit", partition="gpu"),
     (PENDING, W + "PartitionTimeLimit (asks for more time than partition gpu allows)" + NEVER)),
    (dict(state="PENDING", reason="QOSMaxGRESPerJob"),
     (PENDING, W + "QOSMaxGRESPerJob (a per-job limit of its QoS or account)" + NEVER)),
    (dict(state="PENDING", reason="DependencyNeverSatisfied"),
     (PENDING, W + "DependencyNeverSatisfied (a job it depends on failed)" + NEVER)),
    (dict(state="CONFIGURING", reason=""), (PENDING, W + "configuring")),
    (dict(state="REQUEUED", reason=""), (PENDING, W + "requeued")),
    (dict(state="REQUEUED", reason="BeginTime"), (PENDING, W + "BeginTime (its start time has not come yet)")),
    (dict(state="REQUEUE_HOLD", reason="JobHeldAdmin"), (PENDING, W + "held after a requeue (scontrol release 5)")),
    (dict(state="SPECIAL_EXIT"), (PENDING, W + "held after a requeue (scontrol release 5)")),
    (dict(state="PENDING", reason="WaitingForScheduling"), (PENDING, W + "WaitingForScheduling (not scheduled yet)")),
    (dict(state="REQUEUE_FED"), (PENDING, W + "requeue_fed")),
    (dict(state="POWER_UP_NODE"), (PENDING, W + "power_up_node")),
    (dict(state="RESV_DEL_HOLD", reason="JobHeldAdmin"), (PENDING, W + "JobHeldAdmin (held by an administrator)")),
    (dict(state="RUNNING"), (RUNNING, None)),
    (dict(state="COMPLETING"), (RUNNING, None)),
    (dict(state="SIGNALING"), (RUNNING, None)),
    (dict(state="STAGE_OUT"), (RUNNING, None)),
    (dict(state="RESIZING"), (RUNNING, None)),
    (dict(state="SUSPENDED"), (RUNNING, "suspended by Slurm (SUSPENDED)")),
    (dict(state="STOPPED"), (RUNNING, "suspended by Slurm (STOPPED)")),
    (dict(state="COMPLETED", exit_code=0, signal=0), (SUCCEEDED, None)),
    (dict(state="FAILED", exit_code=3, signal=0), (FAILED, "exit code 3")),
    (dict(state="FAILED", exit_code=0, signal=9), (FAILED, "the batch script was killed by signal 9")),
    (dict(state="FAILED"), (FAILED, "exit code unknown")),
    (dict(state="TIMEOUT", time_limit="00:01:00"), (FAILED, "TIMEOUT: it reached its time limit (00:01:00)")),
    (dict(state="TIMEOUT"), (FAILED, "TIMEOUT: it reached its time limit")),
    (dict(state="OUT_OF_MEMORY"), (FAILED, "OUT_OF_MEMORY: it ran out of memory")),
    (dict(state="NODE_FAIL", nodelist="node2"), (FAILED, "NODE_FAIL: a node of the job failed (node2)")),
    (dict(state="PREEMPTED"), (FAILED, "PREEMPTED: a higher-priority job preempted it")),
    (dict(state="BOOT_FAIL"), (FAILED, "BOOT_FAIL: a node failed to boot")),
    (dict(state="DEADLINE"), (FAILED, "DEADLINE: it could not end before its deadline")),
    (dict(state="LAUNCH_FAILED"), (FAILED, "LAUNCH_FAILED: Slurm could not launch it")),
    (dict(state="CANCELLED"), (CANCELLED, "cancelled in Slurm")),
    (dict(state="REVOKED"), (UNKNOWN, "Slurm reports the state 'REVOKED', which orch does not know")),
    (dict(state=""), (UNKNOWN, "Slurm reports the state '', which orch does not know")),
]


@pytest.mark.parametrize("fields, expected", ORCH_TABLE, ids=[f"{f['state']}-{f.get('reason', '')}" for f, _ in ORCH_TABLE])
def test_orch_state_table(fields: dict, expected: tuple) -> None:
    assert R.orch_state(R.Info(job_id="5", **fields)) == expected


def test_every_ended_slurm_state_is_a_terminal_orch_state() -> None:
    assert {s: R.orch_state(R.Info("5", s))[0] for s in ENDED} == {
        s: SUCCEEDED if s == "COMPLETED" else CANCELLED if s == "CANCELLED" else FAILED for s in ENDED}


def test_orch_state_of_a_forgotten_job_is_lost() -> None:
    assert R.orch_state(None, "42") == (LOST, "Slurm no longer knows job 42 and it recorded no end")


def test_never_starts() -> None:
    assert [R.never_starts(r) for r in ("PartitionNodeLimit", "QOSMaxNodePerJobLimit", "QOSMaxGRESPerUser",
                                        "Resources", "AssocMaxWallDurationPerJobLimit", "")] == [
        True, True, False, False, True, False]


FACTS = {"partitions": {
    "gpu": {"nodes": 6, "state": "up", "max_time": "1-00:00:00", "max_time_s": 86400, "default": True,
            "max_gpus_per_node": 8, "groups": [{"nodes": 2, "gpus": 8, "cpus": 64, "mem_mb": 512000},
                                               {"nodes": 4, "gpus": 4, "cpus": 32, "mem_mb": 256000}]},
    "cpu": {"nodes": 10, "state": "up", "max_time": "infinite", "max_time_s": None, "default": False,
            "max_gpus_per_node": 0, "groups": [{"nodes": 10, "gpus": 0, "cpus": 128, "mem_mb": 1000000}]}}}


@pytest.mark.parametrize("res, reason", [
    (R.Resources(nodes=6, gpus_per_node=4, mem="200G", time="1-0"), None),
    (R.Resources(nodes=2, gpus_per_node=8, cpus_per_task=64), None),
    (R.Resources(nodes=10, partition="cpu", time="30-0"), None),
    (R.Resources(nodes=7), "asks for 7 nodes but partition gpu has 6"),
    (R.Resources(gpus_per_node=9), "asks for 9 GPUs per node but the nodes of partition gpu have at most 8"),
    (R.Resources(gpus_per_node=1, partition="cpu"), "asks for 1 GPUs per node but the nodes of partition cpu have at most 0"),
    (R.Resources(nodes=3, gpus_per_node=8),
     "asks for 3 nodes with 8 GPUs, 1 CPUs and any memory each but partition gpu has 2 such nodes"),
    (R.Resources(mem="300G", nodes=3), "asks for 3 nodes with 0 GPUs, 1 CPUs and 300G memory each but partition gpu has 2 such nodes"),
    (R.Resources(cpus_per_task=129, partition="cpu"),
     "asks for 1 nodes with 0 GPUs, 129 CPUs and any memory each but partition cpu has 0 such nodes"),
    (R.Resources(time="1-0:0:1"), "asks for time 1-0:0:1 but partition gpu allows at most 1-00:00:00"),
    (R.Resources(partition="big"), "partition big does not exist (partitions: cpu, gpu)"),
])
def test_fits(res: R.Resources, reason: Optional[str]) -> None:
    assert R.fits(FACTS, res) == reason


def test_fits_without_a_default_partition() -> None:
    facts = {"partitions": {"cpu": dict(FACTS["partitions"]["cpu"])}}
    assert R.fits(facts, R.Resources()) == "no partition asked for and the cluster has no default partition"


# -- Slurm's clients replaced by fakes: fallbacks, junk, failures ---------------------------
def fake_bin(tmp_path: Path, **scripts: str) -> dict[str, str]:
    """A PATH holding only the given fake clients (``name=shell body``)."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir(exist_ok=True)
    for name, body in scripts.items():
        (bindir / name).write_text(f"#!/bin/sh\nPATH=/usr/bin:/bin\n{body}\n")
        (bindir / name).chmod(0o755)
    return {"PATH": str(bindir)}


INVALID = "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1"


def test_query_falls_back_to_sacct_when_the_controller_forgot_the_job(tmp_path: Path) -> None:
    env = fake_bin(tmp_path, scontrol=INVALID, squeue=INVALID,
                   sacct="echo '5|CANCELLED by 0|None|0:15|node1|debug|01:00:00'")
    info = S.query("5", env)
    assert info == R.Info("5", "CANCELLED", "", 0, 15, "node1", "", "debug", "01:00:00", "sacct")
    assert R.orch_state(info) == (CANCELLED, "cancelled in Slurm")
    env = fake_bin(tmp_path, sacct="echo 'Slurm accounting storage is disabled' >&2; exit 1")
    assert S.query("5", env) is None


def test_query_survives_junk(tmp_path: Path) -> None:
    env = fake_bin(tmp_path, scontrol="printf 'JobId=5 JobName=x JobState=\\033[31mRUNNING\\377 Reason=\\001 "
                                      "ExitCode=99999999999:x NodeList=%s\\n'; head -c 3000000 /dev/zero" % ("n" * 5000),
                   squeue=INVALID, sacct="exit 1")
    info = S.query("5", env)
    assert info is not None and info.state.startswith("[31mRUNNING") and info.exit_code is None
    assert len(info.nodelist) <= 300 and R.orch_state(info)[0] == UNKNOWN
    env = fake_bin(tmp_path, scontrol="head -c 1000000 /dev/urandom", squeue="head -c 1000000 /dev/urandom")
    assert S.query("5", env) is None


def test_query_says_when_slurm_cannot_be_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    down = "echo 'slurm_load_jobs error: Unable to contact slurm controller (connect failure)' >&2; exit 1"
    env = fake_bin(tmp_path, scontrol=down, squeue=down, sacct="exit 1")
    with pytest.raises(R.SlurmError) as failed:
        S.query("5", env)
    assert str(failed.value) == ("cannot ask Slurm about job 5: scontrol: slurm_load_jobs error: Unable to contact "
                                 "slurm controller (connect failure); squeue: slurm_load_jobs error: Unable to "
                                 "contact slurm controller (connect failure)")
    with pytest.raises(R.SlurmError, match="^scontrol not found on PATH"):
        S.query("5", {"PATH": str(tmp_path / "nothing")})
    monkeypatch.setattr(S, "TIMEOUT_S", 0.5)
    env = fake_bin(tmp_path, scontrol="exec /bin/sleep 30")
    started = time.monotonic()
    with pytest.raises(R.SlurmError, match="^scontrol did not answer within 0.5s"):
        S.query("5", env)
    assert time.monotonic() - started < 10
    with pytest.raises(ValueError):
        S.query("5; rm -rf /", env)


def test_submit_failures_are_one_line(tmp_path: Path) -> None:
    env = fake_bin(tmp_path, sbatch="echo 'sbatch: error: invalid partition specified: gpu' >&2\n"
                                    "echo 'sbatch: error: Batch job submission failed: Invalid partition name "
                                    "specified' >&2; exit 1")
    with pytest.raises(R.SlurmError) as failed:
        S.submit("/x.sbatch", env)
    assert str(failed.value) == ("sbatch refused the job: invalid partition specified: gpu; "
                                 "Invalid partition name specified")
    with pytest.raises(R.SlurmError, match=r"^sbatch refused the job: it printed 'Submitted batch job 7'$"):
        S.submit("/x.sbatch", fake_bin(tmp_path, sbatch="echo 'Submitted batch job 7'"))
    assert S.submit("/x.sbatch", fake_bin(tmp_path, sbatch="echo '7;cluster2'")) == "7"


# -- the real clusters ----------------------------------------------------------------------
def test_a_job_waits_behind_another_then_runs_and_succeeds(slurm: SlurmCluster, tmp_path: Path) -> None:
    job_dir = make_job_dir(tmp_path)
    blocker = submit(slurm, R.Resources(gpus_per_node=2, job_name="blocker"), job_dir,
                     ["bash", "-c", hold(tmp_path, "blocker")])
    wait_until((tmp_path / "blocker.started").exists, what="the job holding both GPUs to start", timeout=WAIT_S)
    job = submit(slurm, R.Resources(gpus_per_node=1, job_name="life"), job_dir,
                 ["bash", "-c", 'echo "gpus=$CUDA_VISIBLE_DEVICES cwd=$PWD"; ' + hold(tmp_path, "life")])
    info = reason_of(slurm, job)
    assert (info.state, info.reason, info.source) == ("PENDING", "Resources", "scontrol")
    assert R.orch_state(info) == (PENDING, "waiting for Slurm: Resources (the nodes it needs are busy)")
    (tmp_path / "blocker.release").touch()
    wait_until((tmp_path / "life.started").exists, what="the job to start", timeout=WAIT_S)
    info = S.query(job, slurm.env)
    assert (info.state, info.nodelist, info.batch_host) == ("RUNNING", short_hostname(), short_hostname())
    assert R.orch_state(info) == (RUNNING, None)
    (tmp_path / "life.release").touch()
    info = state_of(slurm, job)
    assert (info.state, info.exit_code, info.signal) == ("COMPLETED", 0, 0)
    assert R.orch_state(info) == (SUCCEEDED, None)
    assert S.query(blocker, slurm.env).state == "COMPLETED"
    out = (Path(job_dir) / "logs" / f"slurm-{job}.out").read_text()
    assert re.fullmatch(rf"gpus=[01] cwd={job_dir}\n", out), out


def test_a_failing_job_fails_with_its_exit_code(slurm: SlurmCluster, tmp_path: Path) -> None:
    job_dir = make_job_dir(tmp_path)
    job = submit(slurm, R.Resources(job_name="fails"), job_dir, ["bash", "-c", "echo oops >&2; exit 3"])
    info = state_of(slurm, job)
    assert (info.state, info.exit_code, info.signal, info.reason) == ("FAILED", 3, 0, "NonZeroExitCode")
    assert R.orch_state(info) == (FAILED, "exit code 3")
    assert (Path(job_dir) / "logs" / f"slurm-{job}.out").read_text() == "oops\n"
    # Job names and folders with spaces (not orch's) do not confuse the scontrol parser.
    odd = tmp_path / "a dir JobState=RUNNING"
    odd.mkdir()
    other = slurm.sbatch("#!/bin/sh\nexit 4\n", "-J", "a name with spaces", "-o", "/dev/null", cwd=odd)
    info = state_of(slurm, other)
    assert (info.state, info.exit_code) == ("FAILED", 4)
    fields = R.parse_fields(slurm.run("scontrol", "show", "job", "-o", other).stdout)
    assert (fields["JobName"], fields["WorkDir"]) == ("a name with spaces", str(odd))


def test_requests_that_can_never_run(slurm: SlurmCluster, tmp_path: Path) -> None:
    job_dir = make_job_dir(tmp_path)
    with pytest.raises(R.SlurmError) as refused:
        submit(slurm, R.Resources(gpus_per_node=3), job_dir, ["true"])
    assert str(refused.value) == "sbatch refused the job: Requested node configuration is not available"
    job = submit(slurm, R.Resources(nodes=2, job_name="too-many-nodes"), job_dir, ["true"])
    info = reason_of(slurm, job)
    assert info.state == "PENDING" and info.reason in ("PartitionNodeLimit", "PartitionConfig")
    state, reason = R.orch_state(info)
    assert state == PENDING and reason.endswith("partition debug has) — it can never start as asked"), reason
    assert S.signal(job, "TERM", batch_only=True, env=slurm.env) is False  # nothing runs yet
    facts = S.cluster_facts(slurm.env)
    assert R.fits(facts, R.Resources(gpus_per_node=3)) == ("asks for 3 GPUs per node but the nodes of partition "
                                                           "debug have at most 2")
    assert R.fits(facts, R.Resources(nodes=2)) == "asks for 2 nodes but partition debug has 1"


def test_cancel(slurm: SlurmCluster, tmp_path: Path) -> None:
    job_dir = make_job_dir(tmp_path)
    job = submit(slurm, R.Resources(job_name="cancel-me"), job_dir, ["bash", "-c", hold(tmp_path, "c")])
    wait_until((tmp_path / "c.started").exists, what="the job to start", timeout=WAIT_S)
    S.cancel(job, slurm.env)
    info = state_of(slurm, job)
    assert R.orch_state(info) == (CANCELLED, "cancelled in Slurm")
    S.cancel(job, slurm.env)  # already ended, or never there: no error (scancel says nothing)
    S.cancel("999999", slurm.env)
    assert S.signal(job, "TERM", batch_only=True, env=slurm.env) is False  # a signal is told it ended


def test_time_limit_warning_then_timeout(slurm: SlurmCluster, tmp_path: Path) -> None:
    """slurmctld checks time limits (and sends --signal warnings) on a 30 s pass. ``warned``
    (--time=2, signal_before_s=90) gets its SIGUSR1 at the first pass after it starts (Slurm
    may warn up to a pass early), long before its limit; ``timed`` gets TimeLimit=0 once
    running and times out at the next pass, so no test waits for a whole minute of limit."""
    job_dir = make_job_dir(tmp_path)
    warned = submit(slurm, R.Resources(time="2", signal_before_s=90, job_name="warned"), job_dir,
                    ["bash", "-c", f"trap 'echo usr1 >> {tmp_path}/warned.sig' USR1; {hold(tmp_path, 'warned')}"])
    timed = submit(slurm, R.Resources(time="1", signal_before_s=0, job_name="timed"), job_dir,
                   ["bash", "-c", f"trap 'echo term >> {tmp_path}/timed.sig; exit 143' TERM; {hold(tmp_path, 'timed')}"])
    wait_until(lambda: (tmp_path / "warned.started").exists() and (tmp_path / "timed.started").exists(),
               what="both jobs to start", timeout=WAIT_S)
    slurm.run("scontrol", "update", f"JobId={timed}", "TimeLimit=0")
    info = state_of(slurm, timed, ("TIMEOUT",), timeout=TIMEOUT)
    state, reason = R.orch_state(info)
    assert state == FAILED and reason.startswith("TIMEOUT: it reached its time limit"), reason
    assert wait_until(lambda: (tmp_path / "timed.sig").exists()
                      and (tmp_path / "timed.sig").read_text(), what="SIGTERM at the limit", timeout=WAIT_S) == "term\n"
    assert wait_until(lambda: (tmp_path / "warned.sig").exists()
                      and (tmp_path / "warned.sig").read_text(), what="the warning", timeout=TIMEOUT) == "usr1\n"
    assert S.query(warned, slurm.env).state == "RUNNING"  # warned before its limit, and the trap kept it going
    (tmp_path / "warned.release").touch()
    assert state_of(slurm, warned).state == "COMPLETED"


def test_requeue_puts_the_job_back_to_pending(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Slurm holds a requeued job back until BeginTime = now + the credential lifetime
    (AuthInfo cred_expire, default 120 s). Moving that forward (scontrol update StartTime=now)
    is no way out: the new launch on the same node can die with "Job credential revoked"
    (FAILED, exit 1). So the second run is not waited for here."""
    job_dir = make_job_dir(tmp_path)
    job = submit(slurm, R.Resources(requeue=True, job_name="again"), job_dir,
                 ["bash", "-c", f'echo "run ${{SLURM_RESTART_COUNT:-0}}"; {hold(tmp_path, "again")}'])
    wait_until((tmp_path / "again.started").exists, what="the first run", timeout=WAIT_S)
    assert S.requeue(job, slurm.env) is True
    info = wait_until(lambda: (lambda i: i if i and (i.state, i.reason) == (
        "PENDING", "BeginTime") else None)(S.query(job, slurm.env)), what="the requeued job to wait",
                      timeout=WAIT_S)
    assert R.orch_state(info) == (PENDING, "waiting for Slurm: BeginTime (its start time has not come yet)")
    fields = R.parse_fields(slurm.run("scontrol", "show", "job", "-o", job).stdout)
    assert fields["Restarts"] == "1" and fields["Requeue"] == "1"
    out = (Path(job_dir) / "logs" / f"slurm-{job}.out").read_text()  # Slurm writes into the job's own output
    assert re.fullmatch(rf"run 0\nslurmstepd-\S+: error: \*\*\* JOB {job} ON \S+ CANCELLED AT \S+ DUE TO JOB REQUEUE "
                        r"\*\*\*\n", out), out
    S.cancel(job, slurm.env)
    assert state_of(slurm, job).state == "CANCELLED"
    other = submit(slurm, R.Resources(job_name="once"), job_dir, ["bash", "-c", hold(tmp_path, "once")])
    wait_until((tmp_path / "once.started").exists, what="the job to start", timeout=WAIT_S)
    with pytest.raises(R.SlurmError) as refused:
        S.requeue(other, slurm.env)
    assert str(refused.value) == f"scontrol requeue {other}: Requested operation is presently disabled for job {other}"


def test_a_requeue_whose_scontrol_a_signal_ends_is_not_known_to_have_taken(tmp_path: Path) -> None:
    """Inside its own allocation a job's requeue ends the run at once, and Slurm's SIGTERM to the
    run's processes can end scontrol before it exits: that is neither a yes nor a refusal."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    fake.write_text("#!/bin/sh\nkill -TERM $$\n")
    fake.chmod(0o755)
    assert S.requeue("7", {"PATH": f"{bin_dir}:{os.environ['PATH']}"}) is False


def test_signal_batch_only_reaches_the_batch_shell_and_full_reaches_the_steps(slurm: SlurmCluster,
                                                                              tmp_path: Path) -> None:
    job_dir = make_job_dir(tmp_path)
    step = f"trap 'echo usr1 >> {tmp_path}/step.sig' USR1; {hold(tmp_path, 'step')}"
    batch = (f"trap 'echo term >> {tmp_path}/batch.sig' TERM; trap 'echo usr1 >> {tmp_path}/batch.sig' USR1; "
             f"srun --overlap bash -c {shlex.quote(step)} & {hold(tmp_path, 'batch')}; wait")
    job = submit(slurm, R.Resources(job_name="signals"), job_dir, ["bash", "-c", batch])
    wait_until(lambda: (tmp_path / "batch.started").exists()
               and (tmp_path / "step.started").exists(), what="the batch shell and its step", timeout=WAIT_S)
    assert S.signal(job, "SIGTERM", batch_only=True, env=slurm.env) is True
    assert wait_until(lambda: (tmp_path / "batch.sig").exists()
                      and (tmp_path / "batch.sig").read_text(), what="the batch shell's trap", timeout=WAIT_S) == "term\n"
    assert not (tmp_path / "step.sig").exists()  # --batch: the step is not signalled
    assert S.query(job, slurm.env).state == "RUNNING"
    assert S.signal(job, "USR1", batch_only=False, env=slurm.env) is True
    wait_until(lambda: (tmp_path / "step.sig").exists(), what="the step's trap", timeout=WAIT_S)
    wait_until(lambda: "usr1" in (tmp_path / "batch.sig").read_text(),
               what="the batch shell's second trap", timeout=WAIT_S)
    for name in ("batch", "step"):
        (tmp_path / f"{name}.release").touch()
    assert state_of(slurm, job).state == "COMPLETED"
    with pytest.raises(ValueError):
        S.signal(job, "TERM; reboot", batch_only=True, env=slurm.env)


def test_srun_argv_runs_a_task_on_each_node_with_node_indexed_logs(slurm2: SlurmCluster, tmp_path: Path) -> None:
    job_dir = make_job_dir(tmp_path)
    res = R.Resources(nodes=2, gpus_per_node=2, job_name="two-nodes")
    srun = R.srun_argv(res, job_dir, ["sh", "-c", 'echo "$(hostname) node=$SLURM_NODEID gpus=$CUDA_VISIBLE_DEVICES"'])
    job = submit(slurm2, res, job_dir, ["bash", "-c", f"{shlex.join(srun)} && {shlex.join(srun)}"])  # twice: append
    info = state_of(slurm2, job)
    assert (info.state, info.nodelist, info.batch_host) == ("COMPLETED", "node[1-2]", "node1")
    assert S.hostnames(info.nodelist, slurm2.env) == ["node1", "node2"]
    logs = Path(job_dir) / "logs"
    assert (logs / "node0.log").read_text() == "node1 node=0 gpus=0,1\n" * 2
    assert (logs / "node1.log").read_text() == "node2 node=1 gpus=0,1\n" * 2
    assert sorted(p.name for p in logs.iterdir()) == ["node0.log", "node1.log", f"slurm-{job}.out"]


def test_hostnames(slurm: SlurmCluster) -> None:
    assert S.hostnames("a[1-3],b07", slurm.env) == ["a1", "a2", "a3", "b07"]
    for bad in ("a; reboot", "-h", ""):
        with pytest.raises(ValueError):
            S.hostnames(bad, slurm.env)


def test_cluster_facts_and_fits(slurm: SlurmCluster, slurm2: SlurmCluster) -> None:
    for cluster, nodes in ((slurm, 1), (slurm2, 2)):
        facts = S.cluster_facts(cluster.env)
        assert re.fullmatch(r"\d+\.\d+\.\d+", facts["version"]) and facts["accounting"] is False
        debug = facts["partitions"]["debug"]
        assert (debug["nodes"], debug["state"], debug["default"], debug["max_gpus_per_node"], debug["max_time_s"]) \
            == (nodes, "up", True, 2, None)
        assert debug["groups"] == [{"nodes": nodes, "gpus": 2, "cpus": cluster.cpus, "mem_mb": debug["groups"][0]["mem_mb"]}]
        assert R.fits(facts, R.Resources(nodes=nodes, gpus_per_node=2)) is None
        assert R.fits(facts, R.Resources(gpus_per_node=3)) == \
            "asks for 3 GPUs per node but the nodes of partition debug have at most 2"
        assert R.fits(facts, R.Resources(nodes=5)) == f"asks for 5 nodes but partition debug has {nodes}"
        assert R.fits(facts, R.Resources(partition="gpu")) == "partition gpu does not exist (partitions: debug)"


def test_query_of_a_job_slurm_never_had_is_none(slurm: SlurmCluster, tmp_path: Path) -> None:
    assert S.query("999999", slurm.env) is None
    assert R.orch_state(None, "999999") == (LOST, "Slurm no longer knows job 999999 and it recorded no end")
    # squeue answers when scontrol cannot (the fallback's format against the real squeue)
    job = slurm.sbatch("#!/bin/sh\nexit 5\n", "-o", "/dev/null")
    slurm.wait_job(job, timeout=TIMEOUT)
    env = {**fake_bin(tmp_path, scontrol=INVALID), "SLURM_CONF": slurm.env["SLURM_CONF"]}
    env["PATH"] += ":/usr/bin:/bin"
    info = S.query(job, env)
    assert (info.source, info.state, info.exit_code, info.signal, info.nodelist, info.partition) == \
        ("squeue", "FAILED", 5, 0, short_hostname(), "debug")

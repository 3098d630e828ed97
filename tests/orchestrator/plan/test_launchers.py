"""plan/launchers.py: a launcher inside launch.command becomes one exact argv per node (pure)."""

from __future__ import annotations

import shlex

import pytest

from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import Host
from orchestrator.plan import launchers
from orchestrator.plan.build import HostFacts, build_plan
from orchestrator.spec.model import JobSpec

PY = "/venv/bin/python"


def plan(command: str, hosts: int = 1, **launch: object):
    spec = JobSpec.model_validate({"name": "j", "hosts": [f"h{i}" for i in range(hosts)],
                                   "launch": {"command": command, **launch}})
    inv = [Host(name=f"h{i}", address=f"10.0.0.{i + 1}") for i in range(hosts)]
    facts = [HostFacts(python=PY, root=f"/r{i}") for i in range(hosts)]
    return build_plan(spec, "text", ".", "proj", inv, facts, "j-1", rdzv_port=29400 if hosts > 1 else None)


@pytest.mark.parametrize("command, launcher, program", [
    ("torchrun --nproc_per_node 2 t.py --lr 3", "torchrun", ["t.py", "--lr", "3"]),
    ("python3 -m torch.distributed.run --nproc-per-node=2 -m pkg.train", "torchrun", ["pkg.train"]),
    ("accelerate launch --config_file c.yaml --mixed_precision bf16 run.py a", "accelerate", ["run.py", "a"]),
    ("deepspeed --num_gpus=2 train.py --deepspeed ds.json", "deepspeed", ["train.py", "--deepspeed", "ds.json"]),
    ("torchrun --unknown-flag val t.py", "torchrun", ["t.py"]),
    ("torchrun --some-switch t.py x", "torchrun", ["t.py", "x"]),  # unknown flag, next word a script: no value
])
def test_the_launcher_and_its_program_are_found(command: str, launcher: str, program: list[str]) -> None:
    cmd = launchers.parse(shlex.split(command), "auto")
    assert cmd is not None and cmd.launcher == launcher and list(cmd.program) == program


def test_plain_commands_are_not_launchers() -> None:
    for command in ("python t.py", "bash run.sh", "accelerate env", "torchrun_helper.py"):
        assert launchers.parse(shlex.split(command), "auto") is None


def test_one_node_argv_per_launcher() -> None:
    torch = plan("torchrun --nproc_per_node=2 --master_port=1 --max-restarts 3 t.py")
    assert torch.nodes[0].argv == [PY, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                                   "--nproc_per_node", "2", "--max-restarts", "3", "t.py"]
    assert torch.nodes[0].nproc == 2 and torch.nodes[0].launcher == "torchrun" and not torch.nodes[0].direct
    acc = plan("accelerate launch --cpu --num_processes 2 a.py")
    assert acc.nodes[0].argv == [PY, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines",
                                 "1", "--main_process_port", "@free-port@", "--multi_gpu", "a.py"]
    one = plan("accelerate launch --multi_gpu a.py", nproc_per_node=1)
    assert "--multi_gpu" not in one.nodes[0].argv  # accelerate refuses --multi_gpu with 1 process
    ds = plan("deepspeed --num_gpus 4 d.py", nproc_per_node=2)  # job.yaml's number wins
    assert ds.nodes[0].argv == [PY, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port",
                                "@free-port@", "d.py"]


def test_two_nodes_get_their_rank_and_the_rendezvous() -> None:
    acc = plan("accelerate launch --main_process_port 5 a.py", hosts=2, nproc_per_node=2)
    assert [n.argv[3:13] for n in acc.nodes] == [
        ["--num_processes", "4", "--num_machines", "2", "--machine_rank", str(r), "--main_process_ip", "10.0.0.1",
         "--main_process_port", "29400"] for r in (0, 1)]
    ds = plan("deepspeed d.py", hosts=2, nproc_per_node=2)
    assert ds.nodes[1].argv == [PY, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--num_nodes", "2",
                                "--node_rank", "1", "--master_addr", "10.0.0.1", "--master_port", "29400", "--no_ssh",
                                "--hostfile", "/r1/jobs/j-1/deepspeed_hostfile", "d.py"]
    tr = plan("torchrun --nnodes 3 --node_rank 0 t.py", hosts=2, nproc_per_node=1)
    assert tr.nodes[0].argv[3:15] == ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                                      "--rdzv_endpoint", "10.0.0.1:29400", "--rdzv_id", "j-1", "--rdzv_conf",
                                      "join_timeout=300"]
    assert "--node_rank" not in tr.nodes[0].argv


def test_an_explicit_launcher_wraps_a_plain_command() -> None:
    acc = plan("python a.py --x", launcher="accelerate", nproc_per_node=2)
    assert acc.nodes[0].argv[-2:] == ["a.py", "--x"] and acc.nodes[0].argv[1:3] == ["-m", "accelerate.commands.launch"]
    ds = plan("bash run.sh", launcher="deepspeed", nproc_per_node=1)
    assert ds.nodes[0].argv[-3:] == ["--no_python", "bash", "run.sh"]


def test_a_contradicting_launcher_is_refused() -> None:
    with pytest.raises(UsageError, match="starts with torchrun but launch.launcher is `direct`"):
        plan("torchrun t.py", launcher="direct")
    with pytest.raises(UsageError, match="no script"):
        plan("accelerate launch --cpu")


def test_notes_say_which_count_wins() -> None:
    cmd = launchers.parse(shlex.split("torchrun --nproc_per_node 4 --nnodes 2 --master_addr x t.py"), "auto")
    assert cmd is not None
    notes = launchers.notes(cmd, 2, 1)
    assert notes[0].startswith("the command asks for 4 process(es) per node (--nproc_per_node) but "
                               "launch.nproc_per_node is 2: job.yaml wins")
    assert "asks for 2 node(s) but the job has 1" in notes[1]
    assert "--master_addr is replaced" in notes[2]
    assert launchers.notes(launchers.parse(["torchrun", "t.py"], "auto"), "auto", 1) == []


def test_an_accelerate_config_counts_only_when_nothing_else_does() -> None:
    spec = JobSpec.model_validate({"name": "j", "hosts": ["h"], "launch": {"command": "accelerate launch "
                                                                          "--config_file c.yaml a.py"}})
    assert launchers.config_file(spec) == "c.yaml"
    assert launchers.with_config(spec, {"num_processes": 4, "num_machines": 2}).launch.nproc_per_node == 2
    fixed = spec.model_copy(update={"launch": spec.launch.model_copy(update={"nproc_per_node": 3})})
    assert launchers.with_config(fixed, {"num_processes": 4}) is fixed
    assert launchers.with_config(spec, {"num_processes": "many"}) is spec


def test_several_processes_without_gpus_or_accelerates_cpu_get_accelerates_cpu_switch() -> None:
    """ACCELERATE_USE_CPU=true where several processes must share the CPU (issue 39 item 5):
    a node without GPUs running more than one, or accelerate's --cpu for more than one on any
    node; never for one process, nor over the job's own setting."""
    def cpu(command: str, gpus: int, env: dict[str, str] | None = None, **launch: object) -> dict[str, str]:
        spec = JobSpec.model_validate({"name": "j", "hosts": ["h0"], "env": env or {},
                                       "launch": {"command": command, **launch}})
        p = build_plan(spec, "text", ".", "proj", [Host(name="h0", address="10.0.0.1")],
                       [HostFacts(python=PY, root="/r", gpus=gpus)], "j-1")
        return {k: v for k, v in p.nodes[0].env.items() if k == launchers.CPU_ENV}
    on = {launchers.CPU_ENV: "true"}
    assert cpu("accelerate launch --num_processes 2 a.py", 0) == on
    assert cpu("torchrun --nproc_per_node 2 t.py", 0) == on
    assert cpu("accelerate launch --cpu --num_processes 2 a.py", 4) == on
    assert cpu("accelerate launch --num_processes 2 a.py", 4) == {}
    assert cpu("torchrun --nproc_per_node 2 t.py", 2, {"CUDA_VISIBLE_DEVICES": ""}) == on
    assert cpu("python t.py", 0) == {} and cpu("accelerate launch --cpu a.py", 0) == {}
    assert cpu("torchrun --nproc_per_node 2 t.py", 0, {launchers.CPU_ENV: "false"}) == {}

"""The shell forms ``launch.command`` may start with (spec/commandform.py) and a launcher hidden
where orch cannot run it itself (plan/hidden.py): every spelling either becomes the argv orch
runs once per node, or is refused / warned about — never a launcher under orch's torchrun."""

from __future__ import annotations

import re
import shlex

import pytest
from pydantic import ValidationError

from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import Host
from orchestrator.plan import hidden, launchers
from orchestrator.plan.build import HostFacts, build_plan
from orchestrator.spec import commandform
from orchestrator.spec.model import JobSpec

PY = "/venv/bin/python"
TORCHRUN_1 = [PY, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]


def spec(command: str | list[str], hosts: int = 1, **launch: object) -> JobSpec:
    return JobSpec.model_validate({"name": "j", "hosts": [f"h{i}" for i in range(hosts)],
                                   "launch": {"command": command, **launch}})


def plan(command: str | list[str], hosts: int = 1, script: str | None = None, **launch: object):
    inv = [Host(name=f"h{i}", address=f"10.0.0.{i + 1}") for i in range(hosts)]
    facts = [HostFacts(python=PY, root=f"/r{i}") for i in range(hosts)]
    return build_plan(spec(command, hosts, **launch), "text", ".", "proj", inv, facts, "j-1",
                      rdzv_port=29400 if hosts > 1 else None, script=script)


@pytest.mark.parametrize("command, argv, env, cwd", [
    ("cd sub && A=1 torchrun t.py", ["torchrun", "t.py"], [("A", "1")], "sub"),
    ('cd "dir with space" && python t.py', ["python", "t.py"], [], "dir with space"),
    ("env A=1 B=2 torchrun t.py", ["torchrun", "t.py"], [("A", "1"), ("B", "2")], None),
    ("CUDA_VISIBLE_DEVICES=0 exec nohup torchrun t.py", ["torchrun", "t.py"], [("CUDA_VISIBLE_DEVICES", "0")], None),
    ("cd a; cd b && X=$HOME/y python t.py", ["python", "t.py"], [("X", "$HOME/y")], "a/b"),
    ("cd ~/proj && python t.py --pad '<pad>' --v '>=2'", ["python", "t.py", "--pad", "<pad>", "--v", ">=2"], [], "~/proj"),
    ("bash -c 'cd x && python a.py; python b.py'", ["bash", "-c", "cd x && python a.py; python b.py"], [], None),
])
def test_leading_shell_forms_are_taken_off(command: str, argv: list[str], env: list, cwd: str | None) -> None:
    form = commandform.read(shlex.split(command))
    assert (list(form.argv), list(form.env), form.cwd) == (argv, env, cwd)
    assert shlex.split(command)[form.start:] == argv


@pytest.mark.parametrize("command, words", [
    ("python prep.py && torchrun t.py", "`&&` after `python prep.py`"),
    ("python prep.py; torchrun t.py", "`prep.py;` after `python`"),
    ("torchrun t.py | tee log", "`|` after `torchrun t.py`"),
    ("python t.py > out.log 2>&1", "`>` after `python t.py`"),
    ("torchrun t.py &", "`&` after"),
    ("env -i torchrun t.py", "`env -i`"),
    ("A=1 cd sub && torchrun t.py", "a shell gives NAME to cd only"),
    ("cd sub torchrun t.py", "orch runs `cd DIR && COMMAND` in DIR"),
    ("cd $WORK && torchrun t.py", "orch cannot expand that"),
    ("ORCH_JOB_DIR=/x torchrun t.py", "ORCH_ variables are orch's own"),
    ("A=$(pwd) torchrun t.py", "write $$ for a literal $"),
    ("cd sub &&", "names no command"),
])
def test_shell_syntax_orch_does_not_run_is_refused_at_the_field(command: str, words: str) -> None:
    with pytest.raises(ValidationError) as err:
        spec(command)
    assert words in str(err.value) and err.value.errors()[0]["loc"] == ("launch", "command")


def test_a_prefixed_name_may_not_be_a_secret_too() -> None:
    with pytest.raises(ValidationError, match="HF_TOKEN is in both a NAME=value of launch.command and secret_env"):
        JobSpec.model_validate({"name": "j", "hosts": ["h"], "secret_env": ["HF_TOKEN"],
                                "launch": {"command": "HF_TOKEN=x torchrun t.py"}})


@pytest.mark.parametrize("command, module, taken", [
    ("python -m torch.distributed.launch --nproc_per_node 3 t.py", "torch.distributed.launch", 3),
    ("python3.11 -u -X dev -m torch.distributed.run t.py", "torch.distributed.run", 6),
    ("python3 -mtorch.distributed.run t.py", "torch.distributed.run", 2),
    ("/opt/venv/bin/python /opt/venv/bin/torchrun t.py", "torch.distributed.run", 2),
    ("/opt/venv/bin/torchrun t.py", "torch.distributed.run", 1),
    ("python -m accelerate.commands.launch a.py", "accelerate.commands.launch", 3),
])
def test_every_spelling_of_a_launcher_is_recognised(command: str, module: str, taken: int) -> None:
    found = launchers.written_launcher(shlex.split(command))
    assert found is not None and found[1:] == (taken, module)


def test_the_forms_reach_the_plan_as_environment_working_folder_and_one_launcher() -> None:
    p = plan("cd sub && CUDA_VISIBLE_DEVICES=0 env A=x$$y torchrun --nproc_per_node 2 t.py --lr 1")
    assert p.nodes[0].argv == [*TORCHRUN_1, "--nproc_per_node", "2", "--max_restarts", "0", "t.py", "--lr", "1"]
    assert p.workdir == "sub" and p.env == {"CUDA_VISIBLE_DEVICES": "0", "A": "x$$y"}
    assert p.queue is not None and p.queue["pinned"] == [0]  # as if written in env: the queue waits for GPU 0
    direct = plan("A=1 python t.py")
    assert direct.nodes[0].direct and direct.nodes[0].argv == [PY, "t.py"] and direct.workdir is None


def test_the_deprecated_launch_module_runs_itself_with_the_jobs_topology() -> None:
    """torch.distributed.launch is torch.distributed.run with --use-env off: orch runs that module
    (its workers get --local-rank=N), with orch's process count — never nested."""
    p = plan("python -m torch.distributed.launch --nproc_per_node 3 --use_env t.py", nproc_per_node=2)
    assert p.nodes[0].argv == [PY, "-m", "torch.distributed.launch", "--standalone", "--nnodes", "1",
                               "--nproc_per_node", "2", "--max_restarts", "0", "--use_env", "t.py"]
    cmd = launchers.for_spec(spec("python -m torch.distributed.launch t.py"))
    assert cmd is not None
    assert any("--local-rank=N" in n for n in launchers.notes(cmd, "auto", 1))


@pytest.mark.parametrize("command, script, launcher, where", [
    ("bash -c 'torchrun --nproc_per_node 2 t.py'", None, "torchrun", "`bash -c`"),
    ("sh -lc 'cd sub && python -m torch.distributed.launch t.py'", None, "torch.distributed.launch", "`sh -lc`"),
    ("bash -o pipefail -c 'nohup deepspeed t.py | tee x'", None, "deepspeed", "`bash -o pipefail -c`"),
    ("bash run.sh", "#!/bin/bash\nset -e  # torchrun below\nif true; then\n  A=1 accelerate \\\n  launch a.py\nfi\n",
     "accelerate", "run.sh"),
    ("./tools/run.sh --x", "exec /opt/bin/torchrun t.py\n", "torchrun", "tools/run.sh"),
    ("time torchrun t.py", None, "torchrun", "`time`"),
    ("uv run python -m torch.distributed.run t.py", None, "torchrun", "`uv run`"),
])
def test_a_launcher_hidden_in_a_shell_or_a_wrapper_is_found(command: str, script: str | None, launcher: str,
                                                            where: str) -> None:
    found = hidden.find(list(commandform.read(shlex.split(command)).argv), script)
    assert found is not None and (found.launcher, found.where) == (launcher, where)


@pytest.mark.parametrize("command, script", [
    ("bash -c 'echo torchrun; python t.py # deepspeed'", None),
    ("bash run.sh", 'echo "torchrun=$(command -v torchrun)"\npython t.py\n'),
    ("python t.py --launcher torchrun --backend deepspeed", None),
    ("torchrun --nproc_per_node 2 t.py", None),  # orch runs it itself
    ("bash /opt/run.sh", None),  # cannot be read: unseen, not found
])
def test_what_is_not_a_hidden_launcher(command: str, script: str | None) -> None:
    assert hidden.find(shlex.split(command), script) is None


def test_a_hidden_launcher_runs_once_never_under_orchs_torchrun() -> None:
    p = plan("bash -c 'torchrun --nproc_per_node 2 t.py'", nproc_per_node=2)
    assert p.nodes[0].argv == ["bash", "-c", "torchrun --nproc_per_node 2 t.py"]
    assert not p.nodes[0].direct and p.nodes[0].launcher is None
    wrapped = plan("bash run.sh", script="torchrun --nproc_per_node=4 t.py\n")
    assert wrapped.nodes[0].argv == ["bash", "run.sh"]
    plain = plan("bash run.sh", script="python t.py\n", nproc_per_node=2)  # a wrapper of one process: orch's torchrun
    assert plain.nodes[0].argv[:3] == [PY, "-m", "torch.distributed.run"] and plain.nodes[0].argv[-2:] == [
        "bash", "run.sh"]
    once = hidden.check_warnings(spec("bash -c 'torchrun --nproc_per_node 2 t.py'"), None, 1)
    assert len(once) == 1 and "orch runs the command once" in once[0] and \
        "write it first in launch.command: `torchrun --nproc_per_node 2 t.py`" in once[0]


@pytest.mark.parametrize("command, hosts, launch, why", [
    ("bash -c 'torchrun t.py'", 2, {}, "each node would start a world of its own"),
    ("bash -c 'torchrun --nproc_per_node 4 t.py'", 1, {"nproc_per_node": 2}, "ask for 4 process(es) per node, but "
     "launch.nproc_per_node is 2"),
    ("bash -c 'accelerate launch a.py'", 1, {"launcher": "torchrun", "nproc_per_node": 2}, "a world inside each"),
    ("time deepspeed t.py", 1, {"launcher": "deepspeed"}, "a world inside each"),
])
def test_a_hidden_launcher_that_cannot_be_one_world_is_refused(command: str, hosts: int, launch: dict,
                                                               why: str) -> None:
    with pytest.raises(hidden.Refused, match=re.escape(why)) as err:
        plan(command, hosts, **launch)
    assert isinstance(err.value, UsageError) and "the launcher first in launch.command" in str(err.value)


def test_a_script_orch_cannot_read_under_several_processes_is_warned_about() -> None:
    said = hidden.check_warnings(spec("bash /opt/run.sh", nproc_per_node=2), None, 1)
    assert len(said) == 1 and "/opt/run.sh, which orch cannot read" in said[0] and "2 process(es)" in said[0]
    assert hidden.check_warnings(spec("bash /opt/run.sh"), None, 1) == []  # auto: submit says it with the count
    assert hidden.check_warnings(spec("bash /opt/run.sh"), None, 1, nproc=4) != []
    assert hidden.check_warnings(spec("bash /opt/run.sh", nproc_per_node=1), None, 1) == []

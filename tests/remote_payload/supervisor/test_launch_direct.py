"""Issue 11, start and end: a one-process job starts without torchrun's agent (`launch.launcher`)
with the same environment contract, cancel and resume still reach the whole job, and the end
bookkeeping (environment record, manifest) never sits between the job's end and its state."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import Host
from orchestrator.plan.build import HostFacts, build_plan
from orchestrator.spec.model import JobSpec
from remote_payload.contract.jobfolder import sha256_file
from remote_payload.jobdir import processes as proctree
from tests.support.orch import TICKER, Orch, write_job

# What torchrun (--standalone, one process) gives its worker and a direct start gives the same.
SAME = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
        "ROLE_NAME", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS", "PYTHONUNBUFFERED", "PYTHONPATH", "ORCH_NODE_RANK",
        "ORCH_HOST")
# torchrun's agent only: a direct start has no agent, no agent store, no error file.
AGENT_ONLY = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE",
              "TORCHELASTIC_SIGNALS_TO_HANDLE")

ENVDUMP = f"""\
import json, os, sys
import torch, torch.distributed as dist
import remote_payload
env = {{k: os.environ.get(k) for k in {SAME + AGENT_ONLY + ("MASTER_ADDR", "MASTER_PORT")!r}}}
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
out = dict(env=env, rank=dist.get_rank(), world=dist.get_world_size(), backend=dist.get_backend(), sum=t.item(),
           cwd=os.path.basename(os.getcwd()), argv=sys.argv[1:],
           payload=os.path.dirname(os.path.dirname(os.path.abspath(remote_payload.__file__))))
dist.destroy_process_group()
print("ENV " + json.dumps(out, sort_keys=True), flush=True)
"""



def launcher(name: str) -> str:
    return f"  launcher: {name}\n"  # continues write_job's `launch:` mapping


def env_of(orch: Orch, host: str, which: str) -> dict:
    spec = write_job(orch.cwd, f"env-{which}", host, ["python", "envdump.py", "a b"], launcher(which))
    (orch.cwd / "ws" / "envdump.py").write_text(ENVDUMP)
    done = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)
    assert done["state"] == "succeeded", done
    log = (orch.job_dir(done["job_id"]) / "logs" / "node0.log").read_text()
    starting = next(line for line in log.splitlines() if line.startswith("[orch] starting: "))
    assert ("torch.distributed.run" in starting) == (which == "torchrun"), starting
    got = json.loads(next(line for line in log.splitlines() if line.startswith("ENV "))[4:])
    return dict(got, root=str(orch.job_dir(done["job_id"]).parent.parent))


def is_loopback(address: str) -> bool:
    return all(info[4][0] in ("127.0.0.1", "::1") for info in socket.getaddrinfo(address, None))


def test_the_environment_contract_is_torchruns(orch: Orch, host: str) -> None:
    direct, torchrun = env_of(orch, host, "direct"), env_of(orch, host, "torchrun")
    for got in (direct, torchrun):
        assert (got["rank"], got["world"], got["backend"], got["sum"]) == (0, 1, "gloo", 1.0)
        assert got["cwd"] == "code" and got["argv"] == ["a b"]
        # the job imports the payload this host was sent, never an orch installed beside it
        assert Path(got["payload"]).parent == Path(got["root"]) / "payload", (got["payload"], got["root"])
        assert is_loopback(got["env"]["MASTER_ADDR"]) and int(got["env"]["MASTER_PORT"]) > 0
    assert {k: direct["env"][k] for k in SAME} == {k: torchrun["env"][k] for k in SAME}
    assert direct["env"]["RANK"] == "0" and direct["env"]["WORLD_SIZE"] == "1" and direct["env"]["ROLE_NAME"] == "default"
    assert all(direct["env"][k] is None for k in AGENT_ONLY)
    assert torchrun["env"]["TORCHELASTIC_RUN_ID"] and torchrun["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "True"


def plan_for(spec: dict, hosts: int = 1, gpus: int = 0):
    full = {"name": "p", "hosts": [f"h{i}" for i in range(hosts)], **spec}
    return build_plan(JobSpec.model_validate(full), "text", "/ws", "proj",
                      [Host(name=f"h{i}", address=f"10.0.0.{i + 1}") for i in range(hosts)],
                      [HostFacts(python="/py", root="/r", gpus=gpus)] * hosts, "p-20261130-101500-abcd", rdzv_port=29400)


def test_the_plan_starts_one_process_directly_and_more_under_torchrun() -> None:
    job_dir = "/r/jobs/p-20261130-101500-abcd"
    trainer = {"train": {"model": "m", "data": {"train": "d.jsonl"}}}
    node = plan_for(trainer).nodes[0]
    assert node.direct and not node.plain and node.argv == ["/py", "-m", "remote_payload.train", "--config", f"{job_dir}/train.json",
                                         "--out", job_dir]
    command = {"launch": {"command": "python3 train.py --lr 1"}}
    assert plan_for(command).nodes[0].argv == ["/py", "train.py", "--lr", "1"]
    # a command of the user's under auto starts as plain python; `direct` by name keeps torchrun's environment
    assert plan_for(command).nodes[0].plain
    assert not plan_for({"launch": {"command": "python t.py", "launcher": "direct"}}).nodes[0].plain
    forced = plan_for({"launch": {"command": "python train.py", "launcher": "torchrun"}}).nodes[0]
    assert not forced.direct and forced.argv == ["/py", "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                                                 "--nproc_per_node", "1", "--max_restarts", "0", "--no-python",
                                                 "/py", "train.py"]
    assert not plan_for(command, gpus=2).nodes[0].direct  # auto: 2 GPUs, 2 processes
    assert not any(n.direct for n in plan_for(command, hosts=2).nodes)  # auto: 2 nodes
    with pytest.raises(UsageError, match="`direct` starts one process, but nproc_per_node comes to 4"):
        plan_for({"launch": {"command": "python t.py", "launcher": "direct"}}, gpus=4)
    with pytest.raises(UsageError, match="`direct` starts one process, but the job has 2 nodes"):
        plan_for({"launch": {"command": "python t.py", "launcher": "direct"}}, hosts=2)


def test_dry_run_shows_the_direct_argv(orch: Orch) -> None:
    spec = write_job(orch.cwd, "dry", "local", ["python", "train.py", "--x", "1"])
    (orch.cwd / "ws" / "train.py").write_text("print('x')\n")
    node = json.loads(orch("submit", str(spec), "--dry-run").stdout)["nodes"][0]
    assert node["direct"] is True and node["argv"][1:] == ["train.py", "--x", "1"]
    assert "torch.distributed.run" not in node["argv"] and "--no-python" not in node["argv"]


def test_direct_with_two_processes_is_a_validation_error(orch: Orch) -> None:
    spec = write_job(orch.cwd, "two", "local", ["python", "train.py"], launcher("direct"))
    spec.write_text(spec.read_text().replace("nproc_per_node: 1", "nproc_per_node: 2"))
    (orch.cwd / "ws" / "train.py").write_text("print('x')\n")
    for command in ("check", "submit"):
        out = orch(command, str(spec), check=2)
        assert f"{spec.name}:7:13: launch.launcher: `direct` starts one process, but nproc_per_node is 2" in out.stderr
    assert orch.json("ls") == []


def ticking(orch: Orch, job: str, attempt: int) -> dict:
    """The job's status once attempt ``attempt`` prints ticks and the recorded process tree
    (refreshed at each heartbeat) holds the script's own process."""
    log = orch.job_dir(job) / "logs" / "node0.log"
    deadline = time.time() + 90
    while True:
        status = orch.json("status", job)
        worker = [p for p, _ in status.get("procs") or [] if cmdline(p).endswith("tick.py ")
                  and "torch.distributed.run" not in cmdline(p)]
        if f"tick {attempt} 2" in log.read_text() and worker and status.get("attempt") == attempt:
            return status
        assert time.time() < deadline, (status, log.read_text()[-2000:])
        time.sleep(0.2)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.parametrize("which", ["direct", "torchrun"])
def test_cancel_and_resume_stop_and_continue_the_whole_job(orch: Orch, host: str, which: str) -> None:
    spec = write_job(orch.cwd, f"tick-{which}", host, ["python", "tick.py"], launcher(which))
    (orch.cwd / "ws" / "tick.py").write_text(TICKER)
    job = orch.json("submit", str(spec))["job_id"]
    first = ticking(orch, job, 1)
    procs = [tuple(p) for p in first["procs"]]
    commands = [cmdline(pid) for pid, _ in procs]
    if which == "direct":  # the script itself, a child of the supervisor; nothing else (no recorder helper)
        assert len(procs) == 1 and "tick.py" in commands[0] and "torch.distributed.run" not in commands[0], commands
        assert first["child_pid"] == procs[0][0]
    else:  # torchrun's agent and its worker, in a session of its own
        assert len(procs) >= 2 and any("torch.distributed.run" in c for c in commands), commands
    assert orch("cancel", job, "--grace", "10").stdout.strip().endswith("cancelled")
    assert proctree.alive(procs) == []
    outputs = orch.job_dir(job) / "outputs"
    assert (outputs / "checkpoint-1").exists()  # SIGTERM reached the script, which could checkpoint

    orch("resume", job)
    second = ticking(orch, job, 2)
    assert second["attempt"] == 2 and second["state"] == "running"
    assert proctree.alive(procs) == [] and len(list(outputs.glob("attempt-*"))) == 2
    again = [tuple(p) for p in second["procs"]]
    assert orch("cancel", job, "--grace", "10").stdout.strip().endswith("cancelled")
    assert proctree.alive(again) == [] and (outputs / "checkpoint-2").exists()


LAST_WORDS = """\
import os, pathlib
out = pathlib.Path("outputs")
out.mkdir()
(out / "big.bin").write_bytes(os.urandom(8 << 20))
print("done", flush=True)
"""


def test_succeeded_comes_with_a_complete_manifest_and_the_environment_lands_in_it(orch: Orch, host: str) -> None:
    """The end does not wait for the environment record, but the manifest at `succeeded` lists
    every file the job wrote, with its hash; the record lands and the manifest is refreshed."""
    spec = write_job(orch.cwd, "last", host, ["python", "last.py"])
    (orch.cwd / "ws" / "last.py").write_text(LAST_WORDS)
    done = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)
    assert done["state"] == "succeeded"
    job_dir = orch.job_dir(done["job_id"])
    listed = {f["path"]: f for f in json.loads((job_dir / "manifest.json").read_text())["files"]}
    big = job_dir / "code" / "outputs" / "big.bin"
    assert listed["code/outputs/big.bin"]["sha256"] == sha256_file(str(big))
    assert listed["code/outputs/big.bin"]["size"] == big.stat().st_size
    deadline = time.time() + 120
    while "repro/pip-freeze.txt" not in listed:
        assert time.time() < deadline, sorted(listed)
        time.sleep(0.3)
        listed = {f["path"]: f for f in json.loads((job_dir / "manifest.json").read_text())["files"]}
    environment = json.loads((job_dir / "repro" / "environment.json").read_text())
    assert environment["python"].startswith("3.") and environment["torch"].startswith("2.")
    assert "torch==" in (job_dir / "repro" / "pip-freeze.txt").read_text()
    assert orch.json("status", done["job_id"])["state"] == "succeeded"


def test_the_built_in_trainer_runs_directly_in_one_process(orch: Orch, tiny_assets: Path) -> None:
    ws = orch.cwd / "ws"
    shutil.copytree(tiny_assets, ws / "assets")
    spec = orch.cwd / "lora.yaml"
    spec.write_text(json.dumps({
        "name": "solo", "hosts": ["local"], "workspace": {"path": "ws"}, "launch": {"nproc_per_node": 1},
        "train": {"model": "assets/tiny-gpt2", "finetune": "lora", "lora": {"target_modules": ["c_attn"]},
                  "data": {"train": "assets/data/train.jsonl", "max_length": 48}, "precision": "fp32",
                  "batch_size": 4, "max_steps": 4, "eval_every": 1000, "save_every": 2},
    }))
    done = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)
    assert done["state"] == "succeeded", done
    job_dir = orch.job_dir(done["job_id"])
    log = (job_dir / "logs" / "node0.log").read_text()
    assert "-m remote_payload.train" in log and "torch.distributed.run" not in log
    assert (job_dir / "outputs" / "adapter_model.safetensors").is_file()
    assert (job_dir / "checkpoints" / "step-4" / "COMPLETE").exists()
    assert os.path.getsize(job_dir / "metrics.jsonl") > 0

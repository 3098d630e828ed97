"""Scripts launched the way their tutorials launch them (issue 22): a launcher inside
``launch.command`` — torchrun, ``accelerate launch`` (flags, a config file, a DeepSpeed plugin),
``deepspeed`` — runs once per node with the job's processes, never nested under orch's torchrun;
every command finds the host's python first on PATH, also after a login shell; ``env:`` values
expand ``$NAME``; attempts after the first get ``ORCH_ATTEMPT`` and ``resume_args``.

The scripts are written in the style of the upstream ones (the PyTorch DDP tutorial, accelerate's
examples, DeepSpeed's getting-started), on the CPU with gloo."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.support.orch import Orch
from tests.support.scripts import ACCELERATE, DDP_TUTORIAL, DEEPSPEED, RESUMABLE, WRAPPER


def _job(orch: Orch, name: str, host: str, launch: dict, files: dict[str, str], **extra: object) -> Path:
    ws = orch.cwd / "ws"
    ws.mkdir(exist_ok=True)
    for rel, text in files.items():
        (ws / rel).write_text(text)
    spec = orch.cwd / f"{name}.yaml"
    spec.write_text(json.dumps({"name": name, "hosts": [host], "workspace": {"path": "ws"}, "launch": launch,
                                "outputs": ["outputs/", "logs/"], **extra}))
    return spec


def _ranks(orch: Orch, job: str, folder: str = "") -> list[dict]:
    out = orch.job_dir(job) / "code" / folder / "outputs"
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def test_torchrun_in_the_command_runs_once_with_its_own_process_count(orch: Orch, host: str) -> None:
    """`torchrun --nproc_per_node=2` on a host whose login shell has no torchrun: 2 processes,
    not 2 × 2; the command's --master_port is orch's to set; its script arguments stay."""
    spec = _job(orch, "ddp", host, {"command": "torchrun --nproc_per_node=2 --master_port=1234 ddp.py --epochs 2"},
                {"ddp.py": DDP_TUTORIAL})
    check = orch("check", str(spec))
    assert "2 process(es) per node, from the command's --nproc_per_node" in check.stdout
    assert "--master_port is\n    replaced" in check.stdout or "--master_port is replaced" in check.stdout
    plan = json.loads(orch("submit", str(spec), "--dry-run").stdout)
    argv = plan["nodes"][0]["argv"]
    assert argv[1:] == ["-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc_per_node", "2",
                        "--max_restarts", "0", "ddp.py", "--epochs", "2"]
    job = json.loads(orch("submit", str(spec), "--follow", "--json", timeout=300).stdout)
    assert job["state"] == "succeeded", job
    ranks = _ranks(orch, job["job_id"])
    assert [(r["rank"], r["world"], r["local_world"]) for r in ranks] == [(0, 2, 2), (1, 2, 2)]
    assert all(r["seen"] == 64 and r["argv"] == ["--epochs", "2"] for r in ranks)  # each saw its half, twice
    assert (orch.job_dir(job["job_id"]) / "code" / "outputs" / "model.pth").stat().st_size > 0


def test_shell_forms_in_front_of_the_deprecated_launcher_run_one_world_there(orch: Orch, host: str) -> None:
    """`cd sub && GREETING=hi python -m torch.distributed.launch --nproc_per_node 3 ...` with
    nproc_per_node: 2 (issue 38 item 5): orch runs the deprecated module itself, in sub/, with
    GREETING in the job's environment — exactly 2 ranks of one world, each given --local-rank=N
    as that module does (no `FileNotFoundError: 'cd'`, no world inside each worker)."""
    spec = _job(orch, "fwd", host, {"nproc_per_node": 2, "command": "cd sub && GREETING=hi python -m "
                                    "torch.distributed.launch --nproc_per_node 3 ddp.py --epochs 2"}, {})
    (orch.cwd / "ws" / "sub").mkdir()
    (orch.cwd / "ws" / "sub" / "ddp.py").write_text(DDP_TUTORIAL)
    check = orch("check", str(spec))
    assert "(--nproc_per_node) but launch.nproc_per_node is 2" in " ".join(check.stdout.split())
    job = json.loads(orch("submit", str(spec), "--follow", "--json", timeout=300).stdout)
    assert job["state"] == "succeeded", job
    ranks = _ranks(orch, job["job_id"], "sub")
    assert [(r["rank"], r["world"], r["local_world"], r["greeting"]) for r in ranks] == [(0, 2, 2, "hi"), (1, 2, 2, "hi")]
    assert [r["argv"] for r in ranks] == [["--local-rank=0", "--epochs", "2"], ["--local-rank=1", "--epochs", "2"]]
    assert not (orch.job_dir(job["job_id"]) / "code" / "outputs").exists()


def test_a_launcher_inside_bash_c_runs_once_and_check_says_so(orch: Orch) -> None:
    """`bash -c "torchrun --nproc_per_node 2 ..."` with nproc_per_node: 2 ran 4 processes, two
    rank 0s (issue 38 item 5): now orch check warns, naming the form orch runs itself, and the
    command runs once — one world of 2. A count job.yaml contradicts, or two nodes, is exit 2 at
    launch.command's line."""
    spec = _job(orch, "bashc", "local", {"nproc_per_node": 2,
                                         "command": "bash -c 'torchrun --nproc_per_node 2 ddp.py'"},
                {"ddp.py": DDP_TUTORIAL})
    check = orch("check", str(spec))
    said = " ".join(check.stderr.split())
    assert "warning: launch.command starts torchrun inside `bash -c`: orch runs the command once" in said, said
    assert "write it first in launch.command: `torchrun --nproc_per_node 2 ddp.py`" in said
    plan = json.loads(orch("submit", str(spec), "--dry-run").stdout)
    assert plan["nodes"][0]["argv"] == ["bash", "-c", "torchrun --nproc_per_node 2 ddp.py"]
    job = json.loads(orch("submit", str(spec), "--follow", "--json", timeout=300).stdout)
    assert job["state"] == "succeeded", job
    assert [(r["rank"], r["world"]) for r in _ranks(orch, job["job_id"])] == [(0, 2), (1, 2)]
    four = _job(orch, "bashc4", "local", {"nproc_per_node": 2,
                                          "command": "bash -c 'torchrun --nproc_per_node 4 ddp.py'"}, {})
    refused = orch("check", str(four), check=2)
    assert f"{four}:1:" in refused.stderr and "ask for 4 process(es) per node, but launch.nproc_per_node is 2" in \
        " ".join(refused.stderr.split()) and "Traceback" not in refused.stderr


def test_every_command_finds_the_hosts_python_first_also_after_a_login_shell(orch: Orch, host: str) -> None:
    """`bash run.sh` (and a `bash -l` inside it) finds the host's --python and its torchrun
    first; `PATH: /opt/x/bin:$PATH` expands against that PATH; `$$` is one `$`."""
    spec = _job(orch, "wrap", host, {"command": "bash run.sh"}, {"run.sh": WRAPPER},
                env={"PATH": "/opt/orch-none/bin:$PATH", "A": "${HOME}/x$$y"})
    job = json.loads(orch("submit", str(spec), "--follow", "--json", timeout=300).stdout)
    assert job["state"] == "succeeded", job
    log = orch("logs", job["job_id"]).stdout
    bindir = os.path.dirname(sys.executable)
    for line in (f"python={bindir}/python", f"torchrun={bindir}/torchrun", f"login-python={bindir}/python",
                 "path-head=/opt/orch-none/bin", f"A={os.environ.get('HOME', '/root')}/x$y"):
        assert line in log.splitlines(), (line, log)


def test_accelerate_launch_with_flags_or_a_config_file(orch: Orch) -> None:
    """`accelerate launch --cpu --num_processes 2` runs 2 processes (orch puts --multi_gpu in
    --cpu's place: accelerate's --cpu starts one); a config file's num_processes counts, and a
    DeepSpeed plugin in one keeps working."""
    multi = "distributed_type: MULTI_GPU\nnum_machines: 1\nnum_processes: 2\nmachine_rank: 0\nmixed_precision: 'no'\n"
    ds = ("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\nnum_machines: 1\n"
          "num_processes: 1\nmachine_rank: 0\n")
    dsjson = json.dumps({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
                         "zero_optimization": {"stage": 1}})
    files = {"a.py": ACCELERATE, "multi.yaml": multi, "ds.yaml": ds, "ds.json": dsjson}
    cases = [("acc-flags", "accelerate launch --cpu --num_processes 2 a.py --cpu", 2, "MULTI_CPU"),
             ("acc-config", "accelerate launch --config_file multi.yaml a.py --cpu", 2, "MULTI_CPU"),
             ("acc-ds", "accelerate launch --config_file ds.yaml a.py", 1, "DEEPSPEED")]
    specs = [(_job(orch, name, "local", {"command": command}, files), world, kind)
             for name, command, world, kind in cases]
    assert "from num_processes in multi.yaml" in orch("check", str(specs[1][0])).stdout
    for spec, world, kind in specs:
        job = json.loads(orch("submit", str(spec), "--follow", "--json", timeout=400).stdout)
        assert job["state"] == "succeeded", (spec.name, job)
        ranks = _ranks(orch, job["job_id"])
        assert [r["rank"] for r in ranks] == list(range(world)), (spec.name, ranks)
        assert all(r["world"] == world and kind in r["type"] and r["sum"] == world * (world + 1) / 2
                   for r in ranks), (spec.name, ranks)


def test_deepspeed_runs_its_own_launcher_once(orch: Orch) -> None:
    spec = _job(orch, "ds", "local", {"command": "deepspeed --num_gpus 2 train.py --deepspeed_config ds.json"},
                {"train.py": DEEPSPEED})
    plan = json.loads(orch("submit", str(spec), "--dry-run").stdout)
    assert plan["nodes"][0]["argv"][1:] == ["-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port",
                                            "@free-port@", "train.py", "--deepspeed_config", "ds.json"]
    job = json.loads(orch("submit", str(spec), "--follow", "--json", timeout=400).stdout)
    assert job["state"] == "succeeded", job
    assert [(r["rank"], r["world"]) for r in _ranks(orch, job["job_id"])] == [(0, 2), (1, 2)]


def test_a_resumed_attempt_gets_its_number_and_the_resume_args(orch: Orch, host: str) -> None:
    spec = _job(orch, "again", host, {"command": "python train.py --lr 1",
                                      "resume_args": ["--init_from=resume", "--ckpt={last_checkpoint}"]},
                {"train.py": RESUMABLE})
    job = json.loads(orch("submit", str(spec), "--follow", "--json", check=1, timeout=300).stdout)["job_id"]
    job_dir = orch.job_dir(job)
    first = json.loads((job_dir / "status.json").read_text())
    orch("resume", job)
    assert orch.wait_state(job, ("succeeded", "failed"), timeout=300)["state"] == "succeeded"
    out = job_dir / "code" / "outputs"
    assert json.loads((out / "attempt1.json").read_text()) == ["--lr", "1"]
    assert json.loads((out / "attempt2.json").read_text()) == [
        "--lr", "1", "--init_from=resume", f"--ckpt={job_dir / 'code' / 'out' / 'checkpoint-7'}"]
    second = json.loads((job_dir / "status.json").read_text())
    assert second["attempt"] == 2 and second["resumed_from_step"] == 10
    assert second["first_started"] == first["started"] < second["started"]
    rows = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["attempt"], r["step"]) for r in rows] == [(1, s) for s in range(1, 11)] + [(2, s) for s in range(1, 4)]
    status = orch.json("status", job)["progress"]
    assert (status["started_over_at"], status["resumed_from_step"]) == (3, 10)  # the script began again

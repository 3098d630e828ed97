"""orch on a real Slurm cluster through its login node (the loopback sshd): submit, states,
logs, cancel, resume — the user's own script and the built-in trainer (docs/slurm.md)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import Orch
from tests.slurm import SlurmCluster, SlurmLogin

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
               env: dict | None = None) -> Path:
    """The built-in trainer on the tiny GPT-2 with LoRA, no dropout (exact comparisons)."""
    ws = orch.cwd / "ws"
    if not ws.exists():
        shutil.copytree(assets, ws / "assets")
        config = ws / "assets" / "tiny-gpt2" / "config.json"
        cfg = json.loads(config.read_text())
        cfg.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        config.write_text(json.dumps(cfg))
    spec = orch.cwd / f"{name}.yaml"
    spec.write_text(json.dumps({
        "name": name, "hosts": [host], "workspace": {"path": "ws"}, "launch": launch, "env": env or {},
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

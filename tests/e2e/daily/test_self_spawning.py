"""Frameworks that start their own processes (issue 39 item 1): a command orch runs as one
process starts as plain `python` would — none of torchrun's variables — so the
`torch.multiprocessing.spawn` DDP tutorial and Lightning's `Trainer(devices=2)` start their
second rank and end `succeeded`; and a job whose ranks never all joined is named in status.

On the `local` host and the loopback sshd (the spawning cases), CPU and gloo, through the CLI."""

from __future__ import annotations

import json

from tests.support.orch import Orch
from tests.support.poll import wait_until
from tests.support.serverhooks import set_host_hooks

# What torchrun gives a worker (and orch's direct start used to): none may reach a plain start.
TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                      "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                      "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID")

# The DDP tutorial's mp.spawn form, with the guard such scripts carry to also run under torchrun:
# under torchrun's variables it would be one rank of a world of 1.
MP_SPAWN = f"""\
import json, os, pathlib, socket, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

SEEN = sorted(k for k in os.environ if k in {TORCHRUN_VARIABLES!r})


def demo_basic(rank, world_size, port):
    if port is not None:
        os.environ["MASTER_ADDR"] = "localhost"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
    else:
        dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(10, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    optimizer.zero_grad()
    torch.nn.MSELoss()(model(torch.randn(20, 10)), torch.randn(20, 5)).backward()
    optimizer.step()
    out = pathlib.Path("outputs")
    out.mkdir(exist_ok=True)
    (out / f"rank{{dist.get_rank()}}.json").write_text(
        json.dumps({{"rank": dist.get_rank(), "world": dist.get_world_size(), "seen": SEEN}}))
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # tests/support/scripts.py GLOO_EXIT: no finalization for gloo's threads to race (torch#190489)


if __name__ == "__main__":
    if "LOCAL_RANK" in os.environ:  # started by torchrun: this process is one rank of its world
        demo_basic(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None)
    else:
        with socket.socket() as s:
            s.bind(("", 0))
            free = s.getsockname()[1]
        mp.spawn(demo_basic, args=(2, free), nprocs=2, join=True)
"""

LIGHTNING = f"""\
import json, os, pathlib, time
import torch
import lightning as L
from torch.utils.data import DataLoader, TensorDataset

SEEN = sorted(k for k in os.environ if k in {TORCHRUN_VARIABLES!r} and k not in ("LOCAL_RANK", "WORLD_SIZE",
              "MASTER_ADDR", "MASTER_PORT"))  # the four Lightning sets for its own children


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, _):
        time.sleep(1.0)  # a step that takes a while: the default (Rich) bar redraws during each
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    trainer = L.Trainer(strategy="ddp", devices=2, accelerator="cpu", max_steps=3, logger=False,
                        enable_checkpointing=False, enable_model_summary=False)  # its default bar
    trainer.fit(Tiny(), DataLoader(data, batch_size=4))
    out = pathlib.Path("outputs")
    out.mkdir(exist_ok=True)
    (out / f"rank{{trainer.global_rank}}.json").write_text(
        json.dumps({{"rank": trainer.global_rank, "world": trainer.world_size, "seen": SEEN}}))
"""

# Lightning's line as rank 0 prints it before it waits for the others, and then no rank 1.
NEVER_JOINED = """\
import time
print("GPU available: False, used: False", flush=True)
print("Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2", flush=True)
time.sleep(600)
"""


def _submit(orch: Orch, name: str, script: str, follow: bool = True, host: str = "local") -> dict:
    ws = orch.cwd / "ws"
    ws.mkdir(exist_ok=True)
    (ws / f"{name}.py").write_text(script)
    spec = orch.cwd / f"{name}.yaml"
    spec.write_text(json.dumps({"name": name, "hosts": [host], "workspace": {"path": "ws"},
                                "launch": {"command": f"python {name}.py"}, "outputs": ["outputs/", "logs/"]}))
    plan = json.loads(orch("submit", str(spec), "--dry-run").stdout)["nodes"][0]
    assert plan["direct"] and plan["plain"], plan
    args = ("submit", str(spec), "--follow", "--json") if follow else ("submit", str(spec), "--json")
    return json.loads(orch(*args, timeout=300).stdout)


def _ranks(orch: Orch, job: str) -> list[dict]:
    out = orch.job_dir(job) / "code" / "outputs"
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def _log(orch: Orch, job: str) -> str:
    return (orch.job_dir(job) / "logs" / "node0.log").read_text()


def test_the_mp_spawn_tutorial_started_by_plain_python_starts_both_ranks(orch: Orch, host: str) -> None:
    job = _submit(orch, "spawn", MP_SPAWN, host=host)
    assert job["state"] == "succeeded", (job, _log(orch, job["job_id"])[-3000:])
    assert [(r["rank"], r["world"], r["seen"]) for r in _ranks(orch, job["job_id"])] == [(0, 2, []), (1, 2, [])]


def test_lightning_ddp_with_two_devices_started_by_plain_python_trains(orch: Orch, host: str) -> None:
    job = _submit(orch, "lit", LIGHTNING, host=host)
    log = _log(orch, job["job_id"])
    assert job["state"] == "succeeded", (job, log[-3000:])
    assert "All distributed processes registered. Starting with 2 processes" in log
    assert [(r["rank"], r["world"], r["seen"]) for r in _ranks(orch, job["job_id"])] == [(0, 2, []), (1, 2, [])]
    assert "waiting for ranks" not in log
    progress = orch.json("status", job["job_id"])["progress"]  # STEP/LOSS from Lightning's default bar
    assert progress["step"] == 3 and isinstance(progress["loss"], float), progress
    out = orch("plot", job["job_id"], "-o", "lit.png")
    assert " loss, 0 eval_loss" in out.stderr and (orch.cwd / "lit.png").stat().st_size > 0


def test_ranks_that_never_joined_are_named_in_status_until_cancelled(orch: Orch) -> None:
    set_host_hooks(orch, "local", join_wait_s=1)  # the supervisor's wait before it says so (default 2 min)
    job = _submit(orch, "stuck", NEVER_JOINED, follow=False)["job_id"]
    said = "waiting for ranks: 1 of 2 joined (Lightning's MEMBER 1/2, "
    status = wait_until(lambda: (s := orch.json("status", job)) and said in (s.get("reason") or "") and s,
                        what="the reason to name the ranks", timeout=120,
                        detail=lambda: _log(orch, job)[-2000:])
    assert status["state"] == "running"
    assert said in " ".join(orch("status", job).stdout.split())
    assert f"[orch] {said}" in _log(orch, job)
    assert orch("cancel", job, "--grace", "5").stdout.strip().endswith("cancelled")
    assert orch.json("status", job)["state"] == "cancelled"

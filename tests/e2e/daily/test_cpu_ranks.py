"""Several processes on a host without GPUs (issue 39 item 5): they are one world on the CPU,
never ranks that each train alone — and where a script's ranks do train alone anyway, metrics
keep one row per step and the job's reason says so.

On the `local` host (no GPU), through the CLI; accelerate's scripts under its own launcher."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.orch import Orch
from tests.support.scripts import ACCELERATE

# Each rank trains alone (it never joins a group) and prints what Hugging Face's Trainer prints
# then: its world-size-1 warning, a dict line per logging step with the bar's redraw after it.
# Rank 1 prints only once rank 0 is done, as a rank that drifted far behind would.
ALONE = """\
import os, pathlib, sys, time
rank = int(os.environ["RANK"])
done = pathlib.Path("rank0.done")
if rank == 1:
    while not done.exists():
        time.sleep(0.2)
print("torch.distributed process group is initialized, but parallel_mode != ParallelMode.DISTRIBUTED. "
      "In order to use Torch DDP, launch your script with `python -m torch.distributed.launch", flush=True)
for step in (2, 4, 6):
    sys.stdout.write("\\r                    \\r{'loss': '%.3f', 'learning_rate': '4e-05', 'epoch': '%.2f'}\\n"
                     % (6.0 - step / 10, step / 6))
    sys.stdout.write("\\r %d%%|#    | %d/6 [00:00<00:00, 25.52it/s]" % (step * 100 // 6, step))
    sys.stdout.flush()
sys.stdout.write("\\n")
sys.stdout.flush()
if rank == 0:
    done.write_text("")
"""


def _job(orch: Orch, name: str, command: str, files: dict[str, str]) -> Path:
    ws = orch.cwd / f"ws-{name}"
    ws.mkdir(exist_ok=True)
    for rel, text in files.items():
        (ws / rel).write_text(text)
    spec = orch.cwd / f"{name}.yaml"
    spec.write_text(json.dumps({"name": name, "hosts": ["local"], "workspace": {"path": ws.name},
                                "launch": {"command": command}, "outputs": ["outputs/"]}))
    return spec


def test_accelerate_on_a_host_without_gpus_runs_one_world_on_the_cpu(orch: Orch) -> None:
    """`accelerate launch --num_processes 2` (and its `--cpu` form) of a script that never asks
    for the CPU itself: one world of 2 ranks, MULTI_CPU (ACCELERATE_USE_CPU in the node's env)."""
    for name, command in (("acc-nogpu", "accelerate launch --num_processes 2 a.py"),
                          ("acc-cpu", "accelerate launch --cpu --num_processes 2 a.py")):
        spec = _job(orch, name, command, {"a.py": ACCELERATE})
        plan = json.loads(orch("submit", str(spec), "--dry-run").stdout)
        assert plan["nodes"][0]["env"]["ACCELERATE_USE_CPU"] == "true", plan["nodes"][0]
        assert "--multi_gpu" in plan["nodes"][0]["argv"] and "--cpu" not in plan["nodes"][0]["argv"]
        job = json.loads(orch("submit", str(spec), "--follow", "--json", timeout=400).stdout)
        assert job["state"] == "succeeded", (name, job)
        assert not job.get("reason"), job
        out = orch.job_dir(job["job_id"]) / "code" / "outputs"
        ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
        assert [(r["rank"], r["world"], r["type"], r["sum"]) for r in ranks] == \
            [(0, 2, "DistributedType.MULTI_CPU", 3.0), (1, 2, "DistributedType.MULTI_CPU", 3.0)], (name, ranks)


def test_ranks_that_train_alone_give_one_row_per_step_and_are_named(orch: Orch) -> None:
    """Two ranks that each trained alone and printed the same Hugging Face lines: metrics.jsonl
    has each step once, and the job (succeeded) says that 2 processes each trained alone."""
    spec = _job(orch, "alone", "torchrun --nproc_per_node 2 alone.py", {"alone.py": ALONE})
    job = json.loads(orch("submit", str(spec), "--follow", "--json", timeout=300).stdout)
    assert job["state"] == "succeeded", job
    status = json.loads((orch.job_dir(job["job_id"]) / "status.json").read_text())
    said = "2 processes each trained alone (world size 1): Hugging Face's 'parallel_mode != ParallelMode.DISTRIBUTED'"
    assert (status["reason"] or "").startswith(said + " was printed 2 times"), status
    rows = [json.loads(line) for line in (orch.job_dir(job["job_id"]) / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows if "loss" in r] == [(2, 5.8), (4, 5.6), (6, 5.4)], rows
    assert "2 processes each trained alone" in orch("logs", job["job_id"]).stdout

"""Helpers of the move tests (tests/move, tests/slurm): a tiny trainer job that checkpoints
often and can be slowed down, waiting on a condition, and reading what a run left."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from tests.support.orch import Orch, exact_workspace
from tests.support.poll import wait_until
from tests.support.serverhooks import set_host_hooks


def trainer_spec(orch: Orch, assets: Path, host: str, name: str, *, delay: float = 0.0, steps: int = 12) -> Path:
    """A LoRA job of the tiny GPT-2 (fp32, no dropout: exact) checkpointing every 3 steps;
    ``delay``: from now on, every trainer job on ``host`` sleeps that long after each step (the
    harness's ``step_delay_s`` in that host's root, tests/support/serverhooks.py; no number
    changes; a job moved on runs at full speed)."""
    exact_workspace(orch.cwd, assets)
    if delay:
        set_host_hooks(orch, host, step_delay_s=delay)
    spec = orch.cwd / f"{name}.yaml"
    spec.write_text(json.dumps({
        "name": name, "hosts": [host], "workspace": {"path": "ws"}, "launch": {"nproc_per_node": 1},
        "train": {"model": "assets/tiny-gpt2", "finetune": "lora",
                  "lora": {"r": 4, "dropout": 0.0, "target_modules": ["c_attn"]},
                  "data": {"train": "assets/data/train.jsonl", "max_length": 48}, "precision": "fp32",
                  "batch_size": 2, "max_steps": steps, "save_every": 3, "eval_every": 1000, "log_every": 1},
    }))
    return spec


def adapter(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "outputs" / "adapter_model.safetensors")


def steps_logged(run: Path) -> list[int]:
    """The steps of metrics.jsonl's training rows (eval rows carry an eval loss instead)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r["step"] for r in rows if "loss" in r]


def reference_and_stopped(orch: Orch, assets: Path, host: str = "local") -> tuple[str, str, Path, int]:
    """An uninterrupted run on `local` (the reference), and the same job on ``host`` cancelled
    after its first checkpoint: (reference id, job id, the job's folder, its last checkpoint's step)."""
    ref = json.loads(orch("submit", str(trainer_spec(orch, assets, "local", "ref")), "--follow", "--json",
                          timeout=600).stdout)
    assert ref["state"] == "succeeded", ref
    job = json.loads(orch("submit", str(trainer_spec(orch, assets, host, "mv", delay=0.5)), "--json").stdout)["job_id"]
    folder = orch.job_dir(job)
    wait_until(lambda: (folder / "checkpoints" / "step-3" / "COMPLETE").exists(),
               what="the first checkpoint", timeout=180)
    orch("cancel", job)
    assert orch.json("status", job)["state"] == "cancelled"
    stopped_at = max(int(p.name[5:]) for p in (folder / "checkpoints").glob("step-*"))
    assert stopped_at < 12, "the job ended before it could be moved"
    return ref["job_id"], job, folder, stopped_at


def assert_same_run(orch: Orch, ref: str, job: str) -> None:
    """Both jobs fetched: the same adapter bit for bit, and the job's metrics hold steps 1..12 once each."""
    for j in (ref, job):
        orch("fetch", j)
    a, b = adapter(orch.cwd / "runs" / ref), adapter(orch.cwd / "runs" / job)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert steps_logged(orch.cwd / "runs" / job) == list(range(1, 13))


def superseded(jobs: Path, job_id: str) -> Path:
    """The one folder a moved job's earlier attempt was set aside as, under a host's ``jobs/``
    (``.superseded/<id>-<time>/``, with its ``superseded.json``)."""
    found = sorted((jobs / ".superseded").glob(f"{job_id}-*"))
    assert len(found) == 1 and (found[0] / "superseded.json").is_file(), found
    return found[0]

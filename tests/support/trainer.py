"""Helpers for the trainer tests: configs and a real torchrun.

Every run goes through `python -m torch.distributed.run ... -m remote_payload.train` with gloo on
CPU, cwd = the assets folder (as the supervisor uses the job's code snapshot) and
HF_HUB_OFFLINE=1, so models and tokenizers load with from_pretrained from local folders.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))

from make_tiny_assets import make_tiny_assets  # noqa: E402,F401


def base_config(**overrides: object) -> dict:
    """A small LoRA config on the tiny model; `overrides` replace top-level keys."""
    cfg: dict = {
        "model": "tiny-gpt2",
        "finetune": "lora",
        "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["c_attn"]},
        "data": {"train": "data/train.jsonl", "eval": "data/eval.jsonl", "max_length": 64},
        "precision": "fp32",
        "batch_size": 8,
        "max_steps": 20,
        "lr": 1e-3,
        "warmup_steps": 2,
        "log_every": 5,
        "eval_every": 10,
        "save_every": 10,
    }
    cfg.update(overrides)
    return cfg


def trainer_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))}
    env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", HF_HOME=env.get("ORCH_TEST_HF_HOME", "/nonexistent-hf-home"),
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def trainer_argv(out: Path, nproc: int | None) -> list[str]:
    """torchrun with `nproc` processes, or the trainer as a plain process when nproc is None."""
    tail = ["-m", "remote_payload.train", "--config", str(out / "train.json"), "--out", str(out)]
    if nproc is None:
        return [sys.executable, *tail]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), *tail]


def write_config(out: Path, cfg: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.json").write_text(json.dumps(cfg))


def start(out: Path, cfg: dict, assets: Path, nproc: int | None = 1, **env: str) -> subprocess.Popen:
    """Start a trainer in its own session (so a test can signal the whole process group)."""
    write_config(out, cfg)
    log = (out / "log.txt").open("ab")
    return subprocess.Popen(trainer_argv(out, nproc), cwd=assets, env=trainer_env(**env), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def running(proc: subprocess.Popen, before: str) -> bool:
    """True while the trainer ``proc`` runs. Once it has exited, AssertionError naming what a
    test waited for ``before`` its end (a wait that can no longer succeed), with its exit code."""
    assert proc.poll() is None, f"trainer exited ({proc.returncode}) before {before}"
    return True


def run(out: Path, cfg: dict, assets: Path, nproc: int | None = 1, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """Run a trainer to the end; stdout+stderr in `.stdout`."""
    write_config(out, cfg)
    return subprocess.run(trainer_argv(out, nproc), cwd=assets, env=trainer_env(**env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def train_losses(out: Path) -> list[float]:
    return [m["loss"] for m in metrics(out) if "loss" in m]

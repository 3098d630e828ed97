"""Checkpoints and resume under real torchrun: SIGKILL + resume is bit-identical, a torn save is
ignored, SIGTERM checkpoints and stops, and a finished run started again does not retrain."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.support.poll import wait_until
from tests.support.trainer import base_config, metrics, run, running, start, train_losses


def children(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def gone(pid: int) -> bool:
    """The process has ended (a zombie nobody reaped yet counts as ended)."""
    try:
        return "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return True


def weights(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def kill_hard(proc: subprocess.Popen) -> list[int]:
    """SIGKILL a torchrun run; its workers (in sessions of their own: killpg does not reach
    them) die with the agent (PR_SET_PDEATHSIG), not as orphans still training."""
    workers = children(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    wait_until(lambda: all(gone(pid) for pid in workers), what=f"workers {workers} to end with their torchrun agent",
               timeout=30, interval=0.01)
    return workers


def kill_after_checkpoint(job: Path, cfg: dict, assets: Path, nproc: int, step: int) -> list[int]:
    """Start the run in ``job``, SIGKILL it once checkpoint ``step`` is complete; its workers."""
    proc = start(job, cfg, assets, nproc=nproc)
    complete = job / "checkpoints" / f"step-{step}" / "COMPLETE"
    wait_until(lambda: running(proc, f"{complete} appeared") and complete.exists(), what=f"{complete} to appear",
               timeout=300, interval=0.01)
    workers = kill_hard(proc)
    assert not (job / "outputs").exists(), "the run finished before it could be killed"
    return workers


def assert_resumes_bit_identical(ref: Path, job: Path, cfg: dict, assets: Path, nproc: int) -> None:
    """Resume the killed run in ``job``: it says so and exports what the uninterrupted ``ref`` did."""
    resumed = run(job, cfg, assets, nproc=nproc)
    assert resumed.returncode == 0, resumed.stdout
    assert "resuming from" in resumed.stdout
    assert_bit_identical(ref / "outputs", job / "outputs")


def assert_kill_and_resume_match(tmp_path: Path, cfg: dict, assets: Path, nproc: int, kill_at: int) -> tuple[Path, Path]:
    """Run `cfg` uninterrupted (``ref``), then again (``job``) killed after checkpoint `kill_at` and
    resumed: the resumed run's outputs, last checkpoint and last loss are the uninterrupted run's, bit
    for bit. Returns (ref, job)."""
    ref = tmp_path / "ref"
    result = run(ref, cfg, assets, nproc=nproc)
    assert result.returncode == 0, result.stdout
    job = tmp_path / "job"
    kill_after_checkpoint(job, cfg, assets, nproc, kill_at)
    assert_resumes_bit_identical(ref, job, cfg, assets, nproc)
    last = f"step-{cfg['max_steps']}"
    assert_bit_identical(ref / "checkpoints" / last, job / "checkpoints" / last)
    assert train_losses(ref)[-1] == train_losses(job)[-1]
    return ref, job


def assert_bit_identical(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys() and wa
    assert all(torch.equal(wa[k], wb[k]) for k in wa), [k for k in wa if not torch.equal(wa[k], wb[k])]


@pytest.mark.parametrize(("nproc", "finetune"), [(1, "lora"), (2, "full")])
def test_a_run_killed_after_a_checkpoint_resumes_bit_identical(assets: Path, tmp_path: Path, nproc: int, finetune: str) -> None:
    # Dropout on (model 0.1, LoRA 0.1) so the RNG state has to be restored too; several epochs so set_epoch matters.
    extra = {"lora": {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["c_attn", "c_fc"]}} if finetune == "lora" else {"lora": None}
    cfg = base_config(finetune=finetune, **extra, max_steps=100, save_every=10, keep_checkpoints=20, log_every=10, eval_every=30)
    ref = tmp_path / "ref"
    result = run(ref, cfg, assets, nproc=nproc)
    assert result.returncode == 0, result.stdout

    job = tmp_path / "job"
    assert len(kill_after_checkpoint(job, cfg, assets, nproc, 10)) == nproc
    assert_resumes_bit_identical(ref, job, cfg, assets, nproc)
    assert_bit_identical(ref / "checkpoints" / "step-100", job / "checkpoints" / "step-100")
    assert train_losses(ref)[-1] == train_losses(job)[-1]


def test_a_torn_checkpoint_write_is_ignored_and_the_previous_one_used(assets: Path, tmp_path: Path) -> None:
    cfg = base_config(max_steps=20, save_every=10, keep_checkpoints=2)
    ref = tmp_path / "ref"
    result = run(ref, cfg, assets, nproc=1)
    assert result.returncode == 0, result.stdout

    # What a kill during the save of step 20 leaves: tmp-20 without its marker, no step-20.
    job = tmp_path / "job"
    shutil.copytree(tmp_path / "ref", job, ignore=shutil.ignore_patterns("outputs", "metrics.jsonl"))
    (job / "checkpoints" / "step-20").rename(job / "checkpoints" / "tmp-20")
    (job / "checkpoints" / "tmp-20" / "COMPLETE").unlink()
    (job / "checkpoints" / "tmp-20" / "trainer_state.pt").unlink()
    (job / "checkpoints" / "step-30").mkdir()  # an unmarked folder is never taken for a checkpoint

    resumed = run(job, cfg, assets, nproc=1)
    assert resumed.returncode == 0, resumed.stdout
    assert "step-10: step 10 of 20" in resumed.stdout
    assert not (job / "checkpoints" / "tmp-20").exists()
    assert_bit_identical(ref / "outputs", job / "outputs")

    # Started again after finishing: resumes at the end, re-exports, trains nothing.
    n_lines = len(metrics(job))
    again = run(job, cfg, assets, nproc=1)
    assert again.returncode == 0, again.stdout
    assert "step 20 of 20" in again.stdout and "step 20/20" not in again.stdout
    assert len(metrics(job)) == n_lines + 1  # only the export record
    assert_bit_identical(ref / "outputs", job / "outputs")


def test_sigterm_finishes_the_step_writes_a_checkpoint_and_exits(assets: Path, tmp_path: Path) -> None:
    cfg = base_config(max_steps=100000, save_every=100000, log_every=1, eval_every=100000)
    proc = start(tmp_path, cfg, assets, nproc=2)
    wait_until(lambda: running(proc, "3 metrics rows") and (tmp_path / "metrics.jsonl").exists()
               and len(metrics(tmp_path)) >= 3, what="3 metrics rows", timeout=300, interval=0.01)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) != 0
    log = (tmp_path / "log.txt").read_text()
    (ckpt,) = (tmp_path / "checkpoints").glob("step-*")
    step = int(ckpt.name.removeprefix("step-"))
    assert (ckpt / "COMPLETE").exists() and step >= 3
    # the worker's own exit code: torchrun's agent, signalled too, may stop before it reports one
    assert f"stopped by signal at step {step}; resume continues from the latest checkpoint (exit code 143)" in log

    resumed = run(tmp_path, base_config(max_steps=step + 2, save_every=100000, log_every=1), assets, nproc=2)
    assert resumed.returncode == 0, resumed.stdout
    assert f"resuming from {ckpt}: step {step}" in resumed.stdout

"""metrics.jsonl after a kill and a resume holds each step once, in order, and keeps the rows up to
the checkpoint byte for byte; the rewrite's edge cases; and where the lr schedule ends (one step
after the last: the last step keeps a small, nonzero lr)."""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest

from remote_payload.trainer.checkpoint import latest_checkpoint
from remote_payload.trainer.loop import lr_factor
from remote_payload.trainer.metrics import drop_after
from tests.remote_payload.trainer.test_trainer_resume import kill_hard
from tests.support.poll import wait_until
from tests.support.trainer import base_config, metrics, run, running, start


def complete_rows(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl being written: whole lines only."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def test_a_killed_and_resumed_run_logs_each_step_once(assets: Path, tmp_path: Path) -> None:
    total, warmup = 60, 2
    cfg = base_config(max_steps=total, warmup_steps=warmup, schedule="linear", save_every=20, keep_checkpoints=5,
                      log_every=1, eval_every=10)
    ref = tmp_path / "ref"
    result = run(ref, cfg, assets, nproc=1)
    assert result.returncode == 0, result.stdout

    job = tmp_path / "job"
    proc = start(job, cfg, assets, nproc=1)
    complete = job / "checkpoints" / "step-20" / "COMPLETE"
    wait_until(lambda: running(proc, f"{complete} appeared") and complete.exists(), what=f"{complete} to appear",
               timeout=300, interval=0.01)
    wait_until(lambda: running(proc, "it could be killed")
               and max((r["step"] for r in complete_rows(job / "metrics.jsonl")), default=0) >= 23,
               what="step 23 in metrics.jsonl", timeout=300, interval=0.005)
    kill_hard(proc)
    killed = (job / "metrics.jsonl").read_bytes()
    resumed_at = int(latest_checkpoint(job).name.removeprefix("step-"))
    killed_lines = killed.splitlines(keepends=True)
    before = [line for line in killed_lines if line.endswith(b"\n") and json.loads(line)["step"] <= resumed_at]
    assert len(before) < len(killed_lines), "the killed attempt logged no step after its checkpoint"

    resumed = run(job, cfg, assets, nproc=1)
    assert resumed.returncode == 0, resumed.stdout
    assert f"resuming from {job / 'checkpoints' / f'step-{resumed_at}'}" in resumed.stdout
    assert f"dropped {len(killed_lines) - len(before)} rows written after step {resumed_at}" in resumed.stdout
    final = (job / "metrics.jsonl").read_bytes()
    assert final.startswith(b"".join(before))  # the rows up to the checkpoint, untouched
    assert not (job / "metrics.jsonl.tmp").exists()

    rows, ref_rows = metrics(job), metrics(ref)
    train = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, total + 1))
    assert [r["step"] for r in rows if "eval_loss" in r] == list(range(10, total + 1, 10))
    assert [r["step"] for r in rows if "export" in r] == [total]
    # The same run as the uninterrupted one (fp32 resume is exact): same losses, lrs and norms, step by step.
    keys = ("step", "loss", "lr", "grad_norm", "eval_loss")
    assert [{k: r.get(k) for k in keys} for r in rows] == [{k: r.get(k) for k in keys} for r in ref_rows]
    # The schedule's last used value: linear decay stops one step short of 0.
    assert train[-1]["lr"] == pytest.approx(cfg["lr"] / (total - warmup), rel=1e-9)


@pytest.mark.parametrize(("schedule", "last_two"), [
    ("linear", [2 / 16, 1 / 16]),
    ("cosine", [0.5 * (1 + math.cos(math.pi * 14 / 16)), 0.5 * (1 + math.cos(math.pi * 15 / 16))]),
    ("constant", [1.0, 1.0]),
])
def test_the_schedule_reaches_0_only_one_step_after_the_last(schedule: str, last_two: list[float]) -> None:
    total, warmup = 20, 4
    f = functools.partial(lr_factor, warmup=warmup, total=total, schedule=schedule)
    used = [f(i) for i in range(total)]  # the scheduler's factor for optimizer steps 0 .. total-1
    assert used[-2:] == pytest.approx(last_two) and used[-1] > 0
    assert all(a >= b for a, b in zip(used[warmup:], used[warmup + 1:]))  # never rises after warm-up
    assert f(total) == pytest.approx(1.0 if schedule == "constant" else 0.0)  # one past the last step


def rows_text(*rows: object) -> str:
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)


def test_drop_after_keeps_rows_up_to_the_step_and_drops_later_ones_and_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    kept = rows_text({"step": 9, "loss": 1.0}, {"step": 10, "loss": 0.9}, {"step": 10, "eval_loss": 2.0},
                     "not json: kept", {"note": "no step: kept"})
    path.write_text(kept + rows_text({"step": 11, "loss": 0.8}, {"step": 12, "loss": 0.7}) + '{"step": 13, "lo')
    assert drop_after(path, 10) == 3
    assert path.read_text() == kept
    assert not (tmp_path / "metrics.jsonl.tmp").exists()


def test_drop_after_leaves_a_clean_file_alone_and_a_fresh_start_drops_every_step(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert drop_after(path, 0) == 0 and not path.exists()
    path.write_text(rows_text({"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.9}))
    inode = path.stat().st_ino
    assert drop_after(path, 2) == 0 and path.stat().st_ino == inode  # nothing to drop: not rewritten
    assert drop_after(path, 0) == 2 and path.read_text() == ""  # killed before its first checkpoint

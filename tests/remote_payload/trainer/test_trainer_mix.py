"""data.mix under real torchrun on CPU (gloo): the draw follows the weights, is counted per source
in metrics.jsonl and mix.json, and a run killed after a checkpoint resumes into the same draw;
the counts rule of each mix_strategy; a packed mixture counts every example of its rows."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from remote_payload.contract.train_config import TrainConfig
from remote_payload.trainer import mixture
from tests.support.poll import wait_until
from tests.support.trainer import base_config, metrics, run, running, start

MIX = [{"train": "data/train.jsonl", "weight": 0.7, "format": "alpaca", "eval": "data/eval.jsonl"},
       {"train": "data/text.jsonl", "weight": 0.3, "format": "text"}]


def mix_config(**overrides: object) -> dict:
    """The tiny model on a 70/30 mixture of the alpaca (512) and text (512) files, 2 x 16 examples a step."""
    return base_config(**{"data": {"mix": MIX, "max_length": 64}, "batch_size": 16, "max_steps": 31, "save_every": 15,
                          "eval_every": 100, "log_every": 5, **overrides})


def seen_rows(out: Path) -> dict[int, dict[str, int]]:
    return {m["step"]: m["mix_seen"] for m in metrics(out) if "mix_seen" in m}


def test_counts_follow_each_strategy() -> None:
    # interleave: as many as the concatenation; a source short of its share repeats
    assert mixture.counts([512, 512], [0.7, 0.3], "interleave") == [717, 307]
    # undersample: no example repeats; the scarce source is used up exactly
    assert mixture.counts([100, 1000], [0.5, 0.5], "undersample") == [100, 100]
    assert mixture.counts([90, 1000], [0.3, 0.7], "undersample") == [90, 210]
    # oversample: every example at least once
    assert mixture.counts([100, 1000], [0.5, 0.5], "oversample") == [1000, 1000]
    assert mixture.counts([10, 7], [1, 1], "oversample") == [10, 10]
    # largest remainder: the counts add up to the total, each within one of its share
    got = mixture.counts([1, 1, 1], [1, 1, 1], "interleave")
    assert sum(got) == 3 and got == [1, 1, 1]
    assert mixture.counts([7, 3], [1, 2], "interleave") == [3, 7]


def test_draw_repeats_whole_passes_then_a_seeded_choice() -> None:
    a, b = list(range(10)), list(range(100, 104))
    drawn = mixture.draw([a, b], [7, 10], seed=3)
    assert drawn[:7] == sorted(drawn[:7]) and len(set(drawn[:7])) == 7 and set(drawn[:7]) <= set(a)
    assert sorted(drawn[7:]) == sorted(b * 2 + drawn[15:]) and len(set(drawn[15:])) == 2
    assert drawn == mixture.draw([a, b], [7, 10], seed=3)
    assert drawn != mixture.draw([a, b], [7, 10], seed=4)


def test_config_refuses_what_cannot_be_a_mixture() -> None:
    with pytest.raises(ValueError, match="exactly one of data.train"):
        TrainConfig.model_validate(base_config(data={"train": "a.jsonl", "mix": MIX}))
    with pytest.raises(ValueError, match="greater than 0"):
        TrainConfig.model_validate(base_config(data={"mix": [dict(MIX[0], weight=0)]}))
    with pytest.raises(ValueError, match="format"):
        TrainConfig.model_validate(base_config(data={"mix": [dict(MIX[0], format="sharegpt")]}))
    with pytest.raises(ValueError, match="data.sample goes with data.train"):
        TrainConfig.model_validate(base_config(data={"mix": MIX, "sample": 10}))


def test_a_mixture_draws_by_weight_and_resumes_into_the_same_draw(assets: Path, tmp_path: Path) -> None:
    cfg = mix_config()
    ref = tmp_path / "ref"
    done = run(ref, cfg, assets, nproc=2)
    assert done.returncode == 0, done.stdout
    assert "data.mix (interleave): data/train.jsonl 717 of 512" in done.stdout, done.stdout
    rows = seen_rows(ref)
    final = rows[31]
    assert sum(final.values()) == 31 * 2 * 16  # every example of every step, both ranks
    share = final["data/train.jsonl"] / sum(final.values())
    assert abs(share - 0.7) <= 0.02, final
    assert [rows[s]["data/train.jsonl"] + rows[s]["data/text.jsonl"] for s in (5, 10)] == [160, 320]
    report = json.loads((ref / "mix.json").read_text())
    assert report["step"] == 31 and [s["drawn"] for s in report["sources"]] == [717, 307]
    assert [s["trained"] for s in report["sources"]] == [final["data/train.jsonl"], final["data/text.jsonl"]]
    assert any("eval_loss" in m for m in metrics(ref))  # the mixture's eval set: source 0's eval file

    # killed after checkpoint 15 (each step slowed by the harness's hook), then resumed
    root = tmp_path / "root"
    job = root / "jobs" / "job"
    job.mkdir(parents=True)
    (root / "test-hooks.json").write_text(json.dumps({"step_delay_s": 0.3}))
    proc = start(job, cfg, assets, nproc=2)
    complete = job / "checkpoints" / "step-15" / "COMPLETE"
    wait_until(lambda: running(proc, f"{complete} appeared") and complete.exists(), what=f"{complete}", timeout=300,
               interval=0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    (root / "test-hooks.json").unlink()
    assert not (job / "outputs").exists()
    resumed = run(job, cfg, assets, nproc=2)
    assert resumed.returncode == 0, resumed.stdout
    assert "resuming from" in resumed.stdout
    assert seen_rows(job) == rows  # the same examples per source at every logged step
    assert [m["loss"] for m in metrics(job) if "loss" in m] == [m["loss"] for m in metrics(ref) if "loss" in m]


def test_a_packed_mixture_counts_every_example_of_its_rows(assets: Path, tmp_path: Path) -> None:
    cfg = mix_config(max_steps=4, save_every=100, log_every=4, batch_size=2)
    cfg["data"] = {"mix": MIX, "max_length": 64, "packing": True, "mix_strategy": "undersample"}
    out = tmp_path / "packed"
    done = run(out, cfg, assets, nproc=1)
    assert done.returncode == 0, done.stdout
    assert "packing 731 examples" in done.stdout, done.stdout  # undersample: 512 / 0.7 -> 731 = 512 + 219
    seen = seen_rows(out)[4]
    assert sum(seen.values()) > 4 * 2  # several examples per packed row
    assert seen["data/train.jsonl"] > 0 and seen["data/text.jsonl"] > 0


def test_a_mixture_with_neftune_trains_under_fsdp(assets: Path, tmp_path: Path) -> None:
    cfg = mix_config(finetune="full", lora=None, strategy="fsdp", max_steps=3, log_every=3, batch_size=4)
    cfg["data"] = {"mix": MIX, "max_length": 64, "neftune_alpha": 5.0, "mix_strategy": "oversample"}
    out = tmp_path / "fsdp"
    done = run(out, cfg, assets, nproc=2)
    assert done.returncode == 0, done.stdout
    assert "data.mix (oversample): data/train.jsonl 1195 of 512" in done.stdout, done.stdout  # 512 / 0.3 -> 1707
    assert sum(seen_rows(out)[3].values()) == 3 * 2 * 4
    assert (out / "outputs" / "model.safetensors").is_file()


def test_a_move_names_mix_sources_outside_the_job_folder(tmp_path: Path) -> None:
    from remote_payload.move.job import inputs_outside

    job = tmp_path / "jobs" / "j"
    job.mkdir(parents=True)
    outside = tmp_path / "a.jsonl"
    outside.write_text("{}\n")
    cfg = base_config(data={"mix": [{"train": str(outside), "weight": 1, "eval": "/nowhere/e.jsonl"},
                                    {"train": "data/text.jsonl", "weight": 1}]})
    (job / "train.json").write_text(json.dumps(cfg))
    assert inputs_outside(str(job)) == [
        {"field": "train.data.mix[0].train", "path": str(outside), "bytes": 3},
        {"field": "train.data.mix[0].eval", "path": "/nowhere/e.jsonl", "bytes": None}]

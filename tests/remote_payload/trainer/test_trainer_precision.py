"""Precision and the loss arithmetic: GradScaler order and skipped steps, fp16/bf16 runs on CPU,
and gradient accumulation matching a larger batch across micro-steps and ranks."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from remote_payload.trainer import precision as device_precision
from remote_payload.trainer.loop import lr_factor, optimizer_step
from tests.support.trainer import base_config, metrics, run


def _setup(scale_enabled: bool):
    layer = torch.nn.Linear(4, 4)
    params = list(layer.parameters())
    optimizer = torch.optim.AdamW(params, lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(lr_factor, warmup=0, total=10, schedule="linear"))
    scaler = torch.amp.GradScaler("cpu", enabled=scale_enabled, init_scale=1024.0)
    return layer, params, optimizer, scheduler, scaler


def test_a_step_with_inf_gradients_is_skipped_and_the_scheduler_does_not_advance() -> None:
    layer, params, optimizer, scheduler, scaler = _setup(scale_enabled=True)
    before = [p.detach().clone() for p in params]
    scaler.scale(layer(torch.ones(2, 4)).sum()).backward()
    layer.weight.grad[0, 0] = float("inf")  # the injected overflow
    _, stepped = optimizer_step(params, optimizer, scheduler, scaler, max_grad_norm=1.0)
    assert not stepped
    assert scheduler.last_epoch == 0 and scaler.get_scale() == 512.0
    assert all(torch.equal(a, b) for a, b in zip(before, params))
    assert all(p.grad is None for p in params)

    scaler.scale(layer(torch.ones(2, 4)).sum()).backward()
    _, stepped = optimizer_step(params, optimizer, scheduler, scaler, max_grad_norm=1.0)
    assert stepped and scheduler.last_epoch == 1
    assert not all(torch.equal(a, b) for a, b in zip(before, params))


def test_the_scaler_unscales_before_clipping() -> None:
    layer, params, optimizer, scheduler, scaler = _setup(scale_enabled=True)
    scaler.scale(layer(torch.ones(2, 4)).sum()).backward()
    norm, _ = optimizer_step(params, optimizer, scheduler, scaler, max_grad_norm=None)
    # d(sum(Wx+b))/dW = 2 per element (16), /db = 2 (4): the true, unscaled norm
    assert float(norm) == pytest.approx((20 * 4.0) ** 0.5)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_lr_warms_up_linearly_then_follows_the_schedule(schedule: str) -> None:
    f = functools.partial(lr_factor, warmup=4, total=20, schedule=schedule)
    assert [f(i) for i in range(4)] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert f(4) == 1.0
    assert f(20) == pytest.approx(1.0 if schedule == "constant" else 0.0)
    assert f(12) == pytest.approx({"cosine": 0.5, "linear": 0.5, "constant": 1.0}[schedule])


def test_auto_precision_on_this_cpu_follows_its_bf16_speed() -> None:
    cpu = torch.device("cpu")
    fast = device_precision.probe(cpu).fast_bf16  # AMX
    assert device_precision.autocast_dtype(device_precision.on_device("auto", "ddp", cpu)) is (torch.bfloat16 if fast else None)
    assert device_precision.autocast_dtype(device_precision.on_device("bf16", "ddp", cpu)) is torch.bfloat16


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_mixed_precision_trains_on_cpu_with_gloo(assets: Path, tmp_path: Path, precision: str) -> None:
    result = run(tmp_path, base_config(precision=precision, max_steps=10, log_every=2, lr=5e-3), assets, nproc=2)
    assert result.returncode == 0, result.stdout
    dtype = {"fp16": "torch.float16", "bf16": "torch.bfloat16"}[precision]
    assert f"precision {precision} ({dtype})" in result.stdout
    rows = [m for m in metrics(tmp_path) if "loss" in m]
    assert rows[-1]["loss"] < rows[0]["loss"]
    assert all(("scale" in m) == (precision == "fp16") for m in rows)


def test_gradient_accumulation_and_ranks_match_one_large_batch(assets: Path, tmp_path: Path) -> None:
    """The loss is normalised by label tokens over all micro-steps and ranks: GA 4 x batch 2 and
    2 ranks x GA 2 x batch 2 see the same 8 examples as batch 8 and give the same loss and gradient."""
    common = dict(model="tiny-gpt2-nodrop", finetune="full", lora=None, max_steps=1, log_every=1, warmup_steps=0,
                  data={"train": "data/train.jsonl", "max_length": 64, "group_by_length": False})  # the same 8 first examples
    shapes = {"b8": (1, 8, 1), "b2xga4": (1, 2, 4), "2rx b2xga2": (2, 2, 2)}
    first = {}
    for name, (nproc, batch, ga) in shapes.items():
        out = tmp_path / name.replace(" ", "")
        result = run(out, base_config(**common, batch_size=batch, grad_accum=ga), assets, nproc=nproc)
        assert result.returncode == 0, result.stdout
        first[name] = next(m for m in metrics(out) if "loss" in m)
    for name in shapes:
        assert first[name]["loss"] == pytest.approx(first["b8"]["loss"], rel=1e-5)
        assert first[name]["grad_norm"] == pytest.approx(first["b8"]["grad_norm"], rel=1e-4)

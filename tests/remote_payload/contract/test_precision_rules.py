"""The precision rules (remote_payload/contract/precision.py), decided in one place for the laptop and the
trainer: the rule table, `orch check` / `orch submit` refusing every refused combination with
exit 2 at the field's file:line:col, and real trainer runs resolving `auto` and refusing fsdp +
fp16 through the same functions."""

from __future__ import annotations

import itertools
import typing
from pathlib import Path

import pytest
import torch

from remote_payload.contract import precision
from remote_payload.contract import train_config as config
from remote_payload.contract.precision import DeviceCaps, PrecisionError, resolve
from remote_payload.trainer import precision as device_precision
from tests.support.orch import Orch
from tests.support.trainer import base_config, metrics, run

CPU = DeviceCaps("cpu", "CPU", bf16=True, fast_bf16=False)
AMX_CPU = DeviceCaps("cpu", "CPU with AMX", bf16=True, fast_bf16=True)
A100 = DeviceCaps("cuda", "NVIDIA A100-SXM4-80GB", bf16=True, fast_bf16=True)
V100 = DeviceCaps("cuda", "Tesla V100-SXM2-32GB", bf16=False, fast_bf16=False)
DEVICES = [CPU, AMX_CPU, A100, V100]
ALLOWED = [(p, s) for p, s in itertools.product(precision.PRECISIONS, precision.STRATEGIES)
           if (p, s) not in {(r.precision, r.strategy) for r in precision.REFUSED}]


def test_the_rules_cover_exactly_the_schemas_names() -> None:
    assert typing.get_args(config.Precision) == precision.PRECISIONS
    assert typing.get_args(config.Strategy) == precision.STRATEGIES
    assert precision.REFUSED  # fsdp + fp16, at least
    assert all(r.precision in precision.PRECISIONS and r.strategy in precision.STRATEGIES for r in precision.REFUSED)
    assert ("fp16", "fsdp") not in ALLOWED


@pytest.mark.parametrize(("wanted", "strategy", "device", "expected"), [
    ("auto", "ddp", CPU, "fp32"), ("auto", "fsdp", CPU, "fp32"),
    ("auto", "ddp", AMX_CPU, "bf16"), ("auto", "ddp", A100, "bf16"), ("auto", "fsdp", A100, "bf16"),
    ("auto", "ddp", V100, "fp32"), ("auto", "fsdp", V100, "fp32"),
    ("fp32", "fsdp", A100, "fp32"), ("bf16", "ddp", CPU, "bf16"), ("bf16", "fsdp", A100, "bf16"),
    ("fp16", "ddp", CPU, "fp16"), ("fp16", "ddp", V100, "fp16"), ("fp16", "ddp", A100, "fp16"),
])
def test_the_rule_table(wanted: str, strategy: str, device: DeviceCaps, expected: str) -> None:
    assert resolve(wanted, strategy, device) == expected


@pytest.mark.parametrize(("wanted", "strategy", "device", "message"), [
    *[("fp16", "fsdp", d, "strategy: fsdp does not support fp16") for d in DEVICES],
    ("bf16", "ddp", V100, "precision bf16 is not supported natively on Tesla V100-SXM2-32GB"),
    ("bf16", "fsdp", V100, "precision bf16 is not supported natively on Tesla V100"),
])
def test_refused_combinations_raise_one_line(wanted: str, strategy: str, device: DeviceCaps, message: str) -> None:
    with pytest.raises(PrecisionError, match=message) as caught:
        resolve(wanted, strategy, device)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.name)
@pytest.mark.parametrize(("wanted", "strategy"), list(itertools.product(precision.PRECISIONS, precision.STRATEGIES)))
def test_invariants_over_every_combination(wanted: str, strategy: str, device: DeviceCaps) -> None:
    """Refused from the text exactly when the laptop check says so; `auto` never needs a scaler;
    a GradScaler exactly for fp16."""
    statically_refused = bool(precision.config_problems(wanted, strategy))
    try:
        resolved = resolve(wanted, strategy, device)
    except PrecisionError:
        assert statically_refused or (wanted == "bf16" and not device.bf16)
        return
    assert not statically_refused and resolved in precision.RESOLVED
    assert precision.uses_grad_scaler(resolved) == (resolved == "fp16")
    if wanted == "auto":
        assert resolved == ("bf16" if device.fast_bf16 else "fp32") and not precision.uses_grad_scaler(resolved)


def test_probe_describes_this_cpu() -> None:
    caps = device_precision.probe(torch.device("cpu"))
    assert caps.kind == "cpu" and caps.bf16
    assert caps.fast_bf16 == bool(torch.cpu._is_amx_tile_supported())


def train_job(orch: Orch, wanted: str, strategy: str) -> Path:
    """job.yaml with `precision:` on line 7 (its value at column 14)."""
    path = orch.cwd / "job.yaml"
    path.write_text("name: prec\nhosts: [local]\ntrain:\n  model: tiny-gpt2\n  data: {train: data/train.jsonl}\n"
                    f"  strategy: {strategy}\n  precision: {wanted}\n")
    return path


@pytest.mark.parametrize("refusal", precision.REFUSED, ids=lambda r: f"{r.precision}-{r.strategy}")
@pytest.mark.parametrize("command", ["check", "submit"])
def test_the_laptop_refuses_every_refused_combination_with_exit_2_at_the_field(
        orch: Orch, refusal: precision.Refusal, command: str) -> None:
    out = orch(command, str(train_job(orch, refusal.precision, refusal.strategy)), check=2)
    assert out.stdout == "" and "Traceback" not in out.stderr
    assert f"job.yaml:7:14: train.precision: {refusal.reason}" in out.stderr
    assert not (orch.home / "local").exists()  # the `local` host's root: refused before anything was sent


@pytest.mark.parametrize(("wanted", "strategy"), ALLOWED)
def test_the_laptop_accepts_every_other_combination(orch: Orch, wanted: str, strategy: str) -> None:
    out = orch("check", str(train_job(orch, wanted, strategy)))
    assert "ok — job 'prec'" in out.stdout


def test_a_trainer_run_with_auto_resolves_through_the_same_function(tiny_assets: Path, tmp_path: Path) -> None:
    expected = precision.resolve("auto", "ddp", device_precision.probe(torch.device("cpu")))
    result = run(tmp_path, base_config(precision="auto", max_steps=2, log_every=1, eval_every=2, save_every=2),
                 tiny_assets, nproc=1)
    assert result.returncode == 0, result.stdout
    assert f"precision auto ({device_precision.autocast_dtype(expected) or torch.float32})" in result.stdout
    rows = [m for m in metrics(tmp_path) if "loss" in m]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(("scale" in r) == precision.uses_grad_scaler(expected) for r in rows)


def test_the_trainer_refuses_fsdp_with_fp16_with_the_laptops_message(tiny_assets: Path, tmp_path: Path) -> None:
    """The same rule and words as `orch check`, for a train.json that did not come through it; one
    plain process (nothing would be sharded) is refused too, so the rule does not depend on it."""
    (reason,) = [r.reason for r in precision.REFUSED if (r.precision, r.strategy) == ("fp16", "fsdp")]
    result = run(tmp_path, base_config(strategy="fsdp", precision="fp16", max_steps=2), tiny_assets, nproc=None)
    assert result.returncode == 2, result.stdout
    assert f"ERROR {reason}" in result.stdout
    assert not (tmp_path / "metrics.jsonl").exists()

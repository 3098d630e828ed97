"""The train: schema: defaults, round trip through train.json, and clear rejections."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from remote_payload.contract.train_config import TrainConfig

MINIMAL = {"model": "tiny-gpt2", "data": {"train": "data/train.jsonl"}}


def validate(**overrides: object) -> TrainConfig:
    return TrainConfig.model_validate({**MINIMAL, **overrides})


def test_defaults_match_the_design_example() -> None:
    cfg = validate()
    assert (cfg.finetune, cfg.precision, cfg.batch_size, cfg.grad_accum, cfg.epochs, cfg.max_steps) == ("lora", "auto", 8, 1, 1, None)
    assert (cfg.lr, cfg.warmup_steps, cfg.schedule, cfg.max_grad_norm, cfg.seed) == (2.0e-4, 10, "cosine", 1.0, 42)
    assert (cfg.log_every, cfg.eval_every, cfg.save_every, cfg.keep_checkpoints, cfg.strategy) == (10, 100, 100, 2, "ddp")
    assert cfg.lora is not None and (cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout) == (8, 16, 0.05)
    assert (cfg.data.format, cfg.data.max_length, cfg.data.sample, cfg.data.eval) == ("alpaca", 256, None, None)
    assert not cfg.export.merge_lora and cfg.export.prune is None
    assert (cfg.data.packing, cfg.data.group_by_length, cfg.logits) == (False, True, "labels")  # the fast path by default


@pytest.mark.parametrize(("given", "packing", "grouped"), [({"packing": True}, True, False), ({"group_by_length": False}, False, False),
                                                          ({"packing": False, "group_by_length": None}, False, True)])
def test_length_grouping_is_on_unless_packing_is_or_it_is_turned_off(given: dict, packing: bool, grouped: bool) -> None:
    cfg = validate(data={"train": "t.jsonl", **given})
    assert (cfg.data.packing, cfg.data.group_by_length) == (packing, grouped)
    assert TrainConfig.model_validate_json(cfg.model_dump_json()) == cfg  # train.json keeps the resolved value


@pytest.mark.parametrize("sample", [100, 0.25, 1.0])
def test_resolved_config_round_trips_through_json(sample: float) -> None:
    cfg = validate(finetune="partial", partial={"trainable": ["lm_head"]}, data={"train": "t.jsonl", "sample": sample})
    again = TrainConfig.model_validate_json(cfg.model_dump_json())
    assert again == cfg and type(again.data.sample) is type(sample)


def test_full_finetune_round_trips_without_a_lora_section() -> None:
    cfg = validate(finetune="full")
    assert cfg.lora is None and TrainConfig.model_validate_json(cfg.model_dump_json()) == cfg


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"finetune": "full", "lora": {"r": 4}}, "lora section is only used with finetune: lora"),
        ({"finetune": "partial"}, "finetune: partial needs partial.trainable"),
        ({"partial": {"trainable": ["lm_head"]}}, "partial section is only used with finetune: partial"),
        ({"lora": {"r": 0}}, "greater than 0"),
        ({"lora": {"target_modules": []}}, "at least 1 item"),
        ({"data": {"train": "t", "sample": 0}}, "greater than 0"),
        ({"data": {"train": "t", "sample": 1.5}}, "sample"),
        ({"data": {"train": "t", "format": "csv"}}, "'text' or 'alpaca'"),
        ({"precision": "fp8"}, "'auto', 'fp32', 'fp16' or 'bf16'"),
        ({"finetune": "full", "export": {"merge_lora": True}}, "export.merge_lora needs finetune: lora"),
        ({"export": {"prune": {"amount": 0.3}}}, "set export.merge_lora: true"),
        ({"export": {"prune": {"amount": 1.0}}}, "less than 1"),
        ({"batchsize": 8}, "Extra inputs are not permitted"),
    ],
)
def test_invalid_sections_are_rejected_with_a_clear_message(overrides: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        validate(**overrides)


def test_fsdp_is_accepted_by_the_schema() -> None:
    assert validate(strategy="fsdp").strategy == "fsdp"


def test_config_is_frozen() -> None:
    with pytest.raises(ValidationError):
        validate().lr = 1.0  # type: ignore[misc]


def test_schema_has_a_description_for_every_field() -> None:
    schema = TrainConfig.model_json_schema()
    sections = [schema, *schema["$defs"].values()]
    undescribed = [(s.get("title"), name) for s in sections for name, prop in s.get("properties", {}).items() if "description" not in prop]
    assert undescribed == []


def test_importing_the_config_does_not_import_torch() -> None:
    code = "import sys, remote_payload.contract.train_config; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)

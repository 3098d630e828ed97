"""job.yaml validation through the real CLI: exit 2, file:line:col, field path, hints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.errors import SpecError
from orchestrator.spec.load import load_spec, parse_spec
from orchestrator.spec.model import JobSpec
from tests.support.orch import REPO, Orch

GOOD = "name: ok\nhosts: [local]\nlaunch:\n  command: python train.py --lr 1e-4\n"


def check(orch: Orch, text: str, code: int = 2) -> str:
    path = orch.cwd / "job.yaml"
    path.write_text(text)
    out = orch("check", str(path), check=code)
    assert "Traceback" not in out.stderr
    return out.stderr


def test_a_good_spec_passes_and_a_string_command_is_split(orch: Orch) -> None:
    (orch.cwd / "train.py").write_text("print('hi')\n")
    path = orch.cwd / "job.yaml"
    path.write_text(GOOD)
    assert "ok" in orch("check", str(path)).stdout
    assert load_spec(path).spec.launch.command == ["python", "train.py", "--lr", "1e-4"]


@pytest.mark.parametrize("text, expected", [
    ("name: ok\nhosts: [local]\ntrain:\n  model: m\n  finetune: lora\n  lora: {r: 0}\n  data: {train: t.jsonl}\n",
     "job.yaml:6:13: train.lora.r: must be a positive integer (got 0)"),
    ("name: ok\nhosts: [local]\nlaunch:\n  comand: [x]\n", "job.yaml:4:3: launch.comand: unknown field (did you mean 'command'?)"),
    ("name: Bad Name\nhosts: [local]\nlaunch: {command: [x]}\n", "job.yaml:1:7: name: must be lowercase letters, digits and '-', 1–40 characters, starting and ending with a letter or digit (got 'Bad Name')"),
    ("name: ok\nhosts: []\nlaunch: {command: [x]}\n", "job.yaml:2:8: hosts: must be a list with at least 1 item (got an empty list)"),
    ("name: ok\nhosts: [local]\n", "set exactly one of `train`"),
    ("name: ok\nhosts: [{name: box, adress: h}]\nlaunch: {command: [x]}\n", "hosts.0.adress: unknown field (did you mean 'address'?)"),
    ("name: ok\nhosts: [local]\nlaunch: {command: [x]}\nenv: {'A B': x}\n", "job.yaml:4:6: env: 'A B' is not a valid environment variable name"),
    ("name: ok\nhosts: [local]\nlaunch: {command: [x]}\noutputs: [../../etc]\n", "must stay inside the job folder"),
    ("name: ok\nhosts: [local\n", "job.yaml:3:1: invalid YAML"),
    ("- just\n- a list\n", "must be a mapping"),
    ("", "the job file is empty"),
    ("name: ok\nhosts: [local]\nlaunch: {command: [x]}\nname: other\n",
     "job.yaml:4:1: name: given twice (first on line 1); keep one"),
    ("name: ok\nhosts: [local]\nlaunch:\n  command: [x]\n  nproc_per_node: 1\n  command: [y]\n",
     "job.yaml:6:3: launch.command: given twice (first on line 4); keep one"),
])
def test_invalid_specs_exit_2_with_location_and_field(orch: Orch, text: str, expected: str) -> None:
    assert expected in check(orch, text)


def test_unknown_host_is_exit_2_with_the_known_ones(orch: Orch) -> None:
    assert "unknown host 'nope' (known: local)" in check(orch, GOOD.replace("[local]", "[nope]"))


def test_yaml_alias_bomb_is_refused_quickly(orch: Orch) -> None:
    lines = ["a: &a [1,1,1,1,1,1,1,1,1,1]"]
    for i, name in enumerate("bcdefghij"):
        prev = "abcdefghij"[i]
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 10) + "]")
    assert "too large or too deeply nested" in check(orch, "\n".join(lines) + "\n")


def test_binary_junk_is_a_clear_error(orch: Orch) -> None:
    path = orch.cwd / "job.yaml"
    path.write_bytes(b"\xff\xfe\x00garbage")
    assert "not UTF-8" in orch("check", str(path), check=2).stderr


def test_schema_is_json_schema_with_every_section() -> None:
    schema = JobSpec.model_json_schema()
    assert {"name", "hosts", "workspace", "setup", "env", "presets", "launch", "train", "outputs", "on_finish"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False


def test_orch_schema_prints_it(orch: Orch) -> None:
    assert json.loads(orch("schema").stdout)["title"] == "JobSpec"


def test_every_example_job_in_the_repo_is_valid() -> None:
    jobs = sorted((REPO / "jobs").glob("*.yaml"))
    assert jobs, "the repo ships example jobs"
    for path in jobs:
        load_spec(path)


INTERNALS = ("should match pattern", "literal", "constrained", "Input should", "Value error", "^[", "[key]",
             "greater_than", "int_parsing", "type=")


def assert_plain(err: str) -> None:
    assert not [word for word in INTERNALS if word in err], err


TRAIN = "name: ok\nhosts: [local]\ntrain:\n  model: m\n  data: {train: t.jsonl}\n"


@pytest.mark.parametrize("text, expected", [
    # a pattern: what the name may hold
    ("name: My_Job\nhosts: [local]\nlaunch: {command: [x]}\n",
     "job.yaml:1:7: name: must be lowercase letters, digits and '-', 1–40 characters, starting and ending with "
     "a letter or digit (got 'My_Job')"),
    # literals and enums
    ("name: ok\nhosts: [local]\nlaunch: {command: [x]}\npresets: [autodl, nope]\n",
     "job.yaml:4:19: presets.1: must be one of: autodl, autodl-network-turbo, hf-mirror, pip-mirror, runpod (got 'nope')"),
    (TRAIN + "  finetune: qlora\n", "job.yaml:6:13: train.finetune: must be one of: full, partial, lora (got 'qlora')"),
    (TRAIN + "  precision: fp8\n", "job.yaml:6:14: train.precision: must be one of: auto, fp32, fp16, bf16 (got 'fp8')"),
    # numbers: type and range
    (TRAIN + "  batch_size: many\n", "job.yaml:6:15: train.batch_size: must be a positive integer (got 'many')"),
    (TRAIN + "  batch_size: 1.5\n", "job.yaml:6:15: train.batch_size: must be a positive integer (got 1.5)"),
    (TRAIN + "  warmup_steps: -1\n", "job.yaml:6:17: train.warmup_steps: must be an integer ≥ 0 (got -1)"),
    (TRAIN + "  lr: fast\n", "job.yaml:6:7: train.lr: must be a number > 0 (got 'fast')"),
    (TRAIN + "  lora: {dropout: 1}\n", "job.yaml:6:19: train.lora.dropout: must be a number ≥ 0 and < 1 (got 1)"),
    ("name: ok\nhosts: [{name: b, address: h, port: 70000}]\nlaunch: {command: [x]}\n",
     "job.yaml:2:37: hosts.0.port: must be an integer from 1 to 65535 (got 70000)"),
    # booleans, text, lists, mappings
    ("name: ok\nhosts: [local]\nlaunch: {command: [x]}\non_finish: {shutdown: maybe}\n",
     "job.yaml:4:23: on_finish.shutdown: must be true or false (got 'maybe')"),
    ("name: ok\nhosts: [local]\ntrain:\n  model: ''\n  data: {train: t.jsonl}\n",
     "job.yaml:4:10: train.model: must be non-empty text (got '')"),
    ("name: ok\nhosts: local\nlaunch: {command: [x]}\n", "job.yaml:2:8: hosts: must be a list with at least 1 item (got 'local')"),
    ("name: ok\nhosts: [local]\nworkspace: ./ws\nlaunch: {command: [x]}\n",
     "job.yaml:3:12: workspace: must be a mapping with fields path, exclude (got './ws')"),
    ("name: ok\nhosts: [local]\nlaunch: {command: [x]}\nenv: {A: [1]}\n", "job.yaml:4:10: env.A: must be text (got a list)"),
    # a missing field, and a rule of the model (no "Value error, ")
    ("name: ok\nhosts: [local]\ntrain: {model: m}\n", "job.yaml:3:8: train.data: field required"),
    # a rule across fields points at the field its message starts with, else at the section
    (TRAIN + "  finetune: partial\n", "job.yaml:6:13: train.finetune: finetune: partial needs partial.trainable, the modules to train"),
    (TRAIN + "  finetune: full\n  memory: {quantize: 4bit}\n",
     "job.yaml:7:22: train.memory.quantize: memory.quantize freezes the base weights in 4bit: it needs finetune: lora"),
    (TRAIN + "  strategy: fsdp\n  memory:\n    quantize: 8bit\n",
     "job.yaml:8:15: train.memory.quantize: memory.quantize does not shard: bitsandbytes weights cannot be split by"),
    (TRAIN.replace("{train: t.jsonl}", "{train: t.jsonl, packing: yes, group_by_length: yes}"),
     "train.data.packing: data.packing and data.group_by_length exclude each other"),
    (TRAIN + "  finetune: full\n  lora: {r: 4}\n",
     "job.yaml:4:3: train: the lora section is only used with finetune: lora (finetune is full)"),
    (TRAIN + "  strategy: deepspeed\n  deepspeed: {zero_stage: 2, offload_params: true}\n",
     "job.yaml:7:46: train.deepspeed.offload_params: deepspeed.offload_params needs zero_stage: 3 (it is 2)"),
    (TRAIN + "  strategy: deepspeed\n  memory: {quantize: 4bit}\n",
     "job.yaml:7:22: train.memory.quantize: memory.quantize cannot run under strategy: deepspeed: ZeRO-3 partitions"),
    (TRAIN + "  deepspeed: {zero_stage: 3}\n",
     "job.yaml:4:3: train: the deepspeed section is only used with strategy: deepspeed (strategy is ddp)"),
    (TRAIN + "  strategy: deepspeed\n  deepspeed: {zero_stage: 4}\n",
     "job.yaml:7:27: train.deepspeed.zero_stage: must be one of: 1, 2, 3 (got 4)"),
])
def test_every_error_family_is_said_in_plain_words(orch: Orch, text: str, expected: str) -> None:
    err = check(orch, text)
    assert expected in err
    assert_plain(err)


@pytest.mark.parametrize("value", ["0", "many", "1.5", "[2]"])
def test_a_union_field_gets_one_line_saying_every_allowed_form(orch: Orch, value: str) -> None:
    err = check(orch, f"name: ok\nhosts: [local]\nlaunch:\n  command: [x]\n  nproc_per_node: {value}\n")
    lines = [line for line in err.splitlines() if "nproc_per_node" in line]
    assert len(lines) == 1, err
    assert "job.yaml:5:19: launch.nproc_per_node: must be an integer from 1 to 1024 or auto (got " in lines[0]
    assert_plain(err)


def test_an_optional_union_names_null_too(orch: Orch) -> None:
    err = check(orch, TRAIN.replace("{train: t.jsonl}", "{train: t.jsonl, sample: lots}"))
    assert "train.data.sample: must be a positive integer, a number > 0 and ≤ 1, or null (got 'lots')" in err
    assert err.count("train.data.sample") == 1
    assert_plain(err)


def test_a_host_that_is_neither_a_name_nor_a_mapping(orch: Orch) -> None:
    err = check(orch, "name: ok\nhosts: [local, 7]\nlaunch: {command: [x]}\n")
    assert "job.yaml:2:16: hosts.1: must be text or a mapping with fields name, address, port, user, identity_file, … (got 7)" in err
    assert_plain(err)


@pytest.mark.parametrize("text, expected", [
    ("name: ok\nhosts: [local\nlaunch: {command: [x]}\n",
     "job.yaml:3:7: invalid YAML: expected ',' or ']', but got ':' (the '[' opened at line 2, column 8 is never closed)"),
    ("name: ok\nhosts: [local]\nlaunch: {command: [x]\n",
     "job.yaml:4:1: invalid YAML: expected ',' or '}', but got '<stream end>' (the '{' opened at line 3, column 9 is "
     "never closed)"),
    ("name: \"ok\nhosts: [local]\nlaunch: {command: [x]}\n",
     "job.yaml:4:1: invalid YAML: found unexpected end of stream (the '\"' opened at line 1, column 7 is never closed)"),
])
def test_a_yaml_error_names_where_the_unclosed_bracket_or_quote_began(orch: Orch, text: str, expected: str) -> None:
    assert expected in check(orch, text)


def test_an_env_value_too_large_for_the_server_is_exit_2_naming_it(orch: Orch) -> None:
    big = "x" * (300 * 1024)
    err = check(orch, f"name: ok\nhosts: [local]\nlaunch: {{command: [x]}}\nenv:\n  SMALL: ok\n  BIG: {big}\n")
    assert ("job.yaml:6:8: env.BIG: 300 KiB is too large for an environment variable: the server cannot pass one "
            "over 128 KiB (orch allows 100 KiB) — put it in a file in the workspace and pass its path") in err
    assert "SMALL" not in err and big[:1000] not in err


def test_env_values_too_large_together_are_exit_2(orch: Orch) -> None:
    value = "y" * (90 * 1024)
    names = "\n".join(f"  V{i}: *v" for i in range(1, 12))
    err = check(orch, f"name: ok\nhosts: [local]\nlaunch: {{command: [x]}}\nenv:\n  V0: &v {value}\n{names}\n")
    assert "job.yaml:5:3: env: the variables are 1.1 MiB together" in err and "orch allows 1.0 MiB" in err


def test_a_command_argument_too_large_is_exit_2(orch: Orch) -> None:
    err = check(orch, f"name: ok\nhosts: [local]\nlaunch:\n  command: [python, '{'z' * 150 * 1024}']\n")
    assert "job.yaml:4:12: launch.command: argument 2 is 150 KiB; the server cannot pass one over 128 KiB" in err


def test_a_setup_over_1_mib_is_refused() -> None:
    text = "name: ok\nhosts: [local]\nlaunch: {command: [x]}\nsetup: |\n" + "  : pad\n" * 200_000
    with pytest.raises(SpecError, match=r"job.yaml:4:8: setup: 1.1 MiB is more than orch allows \(1.0 MiB\)"):
        parse_spec(text, Path("job.yaml"))
    assert parse_spec(text[: 600_000], Path("job.yaml")).spec.setup

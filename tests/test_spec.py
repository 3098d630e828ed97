"""job.yaml validation through the real CLI: exit 2, file:line:col, field path, hints."""

from __future__ import annotations

import json

import pytest

from orchestrator.spec import JobSpec, load_spec
from tests.conftest import Orch, REPO

GOOD = "name: ok\nhosts: [local]\nlaunch:\n  command: python train.py --lr 1e-4\n"


def check(orch: Orch, text: str, code: int = 2) -> str:
    path = orch.cwd / "job.yaml"
    path.write_text(text)
    out = orch("check", str(path), check=code)
    assert "Traceback" not in out.stderr
    return out.stderr


def test_a_good_spec_passes_and_a_string_command_is_split(orch: Orch) -> None:
    path = orch.cwd / "job.yaml"
    path.write_text(GOOD)
    assert "ok" in orch("check", str(path)).stdout
    assert load_spec(path).spec.launch.command == ["python", "train.py", "--lr", "1e-4"]


@pytest.mark.parametrize("text, expected", [
    ("name: ok\nhosts: [local]\ntrain:\n  model: m\n  finetune: lora\n  lora: {r: 0}\n  data: {train: t.jsonl}\n",
     "job.yaml:6:13: train.lora.r: Input should be greater than 0"),
    ("name: ok\nhosts: [local]\nlaunch:\n  comand: [x]\n", "job.yaml:4:3: launch.comand: unknown field (did you mean 'command'?)"),
    ("name: Bad Name\nhosts: [local]\nlaunch: {command: [x]}\n", "job.yaml:1:7: name: String should match pattern"),
    ("name: ok\nhosts: []\nlaunch: {command: [x]}\n", "job.yaml:2:8: hosts: List should have at least 1 item"),
    ("name: ok\nhosts: [local]\n", "set exactly one of `train`"),
    ("name: ok\nhosts: [{name: box, adress: h}]\nlaunch: {command: [x]}\n", "hosts.0.adress: unknown field (did you mean 'address'?)"),
    ("name: ok\nhosts: [local]\nlaunch: {command: [x]}\nenv: {'A B': x}\n", "env: Value error, 'A B' is not a valid environment variable name"),
    ("name: ok\nhosts: [local]\nlaunch: {command: [x]}\noutputs: [../../etc]\n", "must stay inside the job folder"),
    ("name: ok\nhosts: [local\n", "job.yaml:3:1: invalid YAML"),
    ("- just\n- a list\n", "must be a mapping"),
    ("", "the job file is empty"),
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

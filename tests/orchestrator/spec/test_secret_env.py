"""``secret_env:`` in a job file: names only, each once, never also in ``env:`` (exit 2, file:line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.errors import RemoteError, UsageError
from orchestrator.jobs import secrets
from orchestrator.state.registry import Registry
from tests.support.orch import Orch

HEAD = "name: ok\nhosts: [local]\nlaunch: {command: [python, -c, 'pass']}\n"


@pytest.mark.parametrize("extra, expected", [
    ("secret_env: [HF_TOKEN=hf_abc]\n", "'HF_TOKEN=hf_abc' is not an environment variable name: list names only"),
    ("secret_env: [HF_TOKEN, HF_TOKEN]\n", "HF_TOKEN listed more than once"),
    ("secret_env: [ORCH_JOB_ID]\n", "ORCH_JOB_ID: ORCH_ variables are orch's own"),
    ("secret_env: [HF_TOKEN]\nenv: {HF_TOKEN: x}\n", "HF_TOKEN is in both env and secret_env"),
    ("secret_env: HF_TOKEN\n", "job.yaml:4:13: secret_env:"),
])
def test_secret_env_takes_names_only(orch: Orch, extra: str, expected: str) -> None:
    path = orch.cwd / "job.yaml"
    path.write_text(HEAD + extra)
    out = orch("check", str(path), check=2)
    assert expected in out.stderr and "Traceback" not in out.stderr
    assert "hf_abc" not in out.stderr.replace("HF_TOKEN=hf_abc", "")


def test_orch_schema_describes_secret_env(orch: Orch) -> None:
    schema = json.loads(orch("schema").stdout)
    field = schema["properties"]["secret_env"]
    assert field["items"] == {"type": "string"} and "laptop's environment" in field["description"]


def test_every_missing_variable_is_named_and_the_values_are_read_from_the_environment() -> None:
    with pytest.raises(UsageError, match="secret_env: A, C are not set in this laptop's environment; orch resume J"):
        secrets.read(["A", "B", "C"], "orch resume J", {"B": "b"})
    assert secrets.read(["B"], "orch submit", {"B": "", "X": "x"}) == {"B": ""}
    with pytest.raises(UsageError, match=r"\$B is larger than an environment variable may be"):
        secrets.read(["B"], "orch submit", {"B": "x" * (200 << 10)})


def test_the_registry_keeps_the_names_through_updates_and_moves_and_never_shows_them(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    registry.add("j-1", "j", "/x/job.yaml", ["a"], "/r/jobs/j-1", "submitting", {"submission": "k"},
                 secret_env=["HF_TOKEN"])
    registry.update("j-1", "running", {"attempt": 1})
    registry.move("j-1", ["b"], "/r/jobs/j-1", {"log_nodes": 1})
    registry.update("j-1", "failed", {"reason": "x"})
    record = registry.get("j-1")
    assert record.secret_env == ["HF_TOKEN"] and "HF_TOKEN" not in str(record.status())
    with pytest.raises(RemoteError, match="asks for secret_env AWS_KEY, which its submit from this laptop did not"):
        secrets.recorded(["HF_TOKEN", "AWS_KEY"], record, "orch rerun j-1")  # a server never picks the names

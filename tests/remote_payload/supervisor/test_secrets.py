"""The server's side of ``secret_env`` (remote_payload/supervisor/secrets.py): checked against
job.json's names, handed over on a pipe, and never shown in orch's own log lines."""

from __future__ import annotations

import io

import pytest

from remote_payload.supervisor import secrets


def test_a_request_must_carry_every_named_value_and_only_strings() -> None:
    assert secrets.checked({"A": "1", "B": "2"}, ["A"]) == {"A": "1"}
    with pytest.raises(ValueError, match="lacks the value of secret_env B") as err:
        secrets.checked({"A": "s3cr3t"}, ["A", "B"])
    assert "s3cr3t" not in str(err.value)
    with pytest.raises(ValueError, match="object of strings"):
        secrets.checked({"A": 1}, ["A"])
    assert secrets.checked(None, None) == {}


def test_values_go_through_a_pipe_and_come_back_whole() -> None:
    sent = io.BytesIO()
    sent.close = lambda: None  # type: ignore[method-assign] - keep the bytes readable
    secrets.hand_over(sent, {"HF_TOKEN": "hf_\u00e9x$(id)'\"", "EMPTY": ""})
    assert secrets.receive(io.BytesIO(sent.getvalue())) == {"HF_TOKEN": "hf_\u00e9x$(id)'\"", "EMPTY": ""}
    assert secrets.receive(io.BytesIO(b"")) == {}
    with pytest.raises(ValueError):
        secrets.receive(io.BytesIO(b"[1, 2]"))


def test_orch_lines_name_a_secret_instead_of_showing_it() -> None:
    job = {"secret_env": ["HF_TOKEN", "SHORT"]}
    env = {"HF_TOKEN": "hf_abcdef", "SHORT": "ab"}
    assert secrets.redact("starting: run --token hf_abcdef ab", job, env) == \
        "starting: run --token [secret HF_TOKEN] ab"
    assert secrets.lacking(job, {"SHORT": "x"}) == ["HF_TOKEN"]

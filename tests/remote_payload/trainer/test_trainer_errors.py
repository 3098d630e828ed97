"""User errors are found before training starts and reported in one line, with exit code 2."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import pytest

from remote_payload.trainer import loop as train
from tests.support.trainer import base_config, run, write_config


@pytest.fixture
def restore_signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_bad_lora_target_modules_fail_under_torchrun_before_training(assets: Path, tmp_path: Path) -> None:
    cfg = base_config(lora={"r": 8, "target_modules": ["q_proj"]})
    result = run(tmp_path, cfg, assets, nproc=2)
    assert result.returncode != 0
    assert "ERROR lora.target_modules ['q_proj']: Target modules {'q_proj'} not found in the base model" in result.stdout
    assert "c_attn" in result.stdout  # the message lists what does exist
    # torchrun prints its own ChildFailedError traceback; none comes from the trainer's code
    assert "remote_payload/" not in result.stdout and not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"finetune": "partial", "lora": None, "partial": {"trainable": ["transformer.h.7", "lm_head"]}},
         "partial.trainable names match no parameter: ['transformer.h.7']"),
        ({"data": {"train": "data/missing.jsonl"}}, "data file not found: data/missing.jsonl"),
        ({"data": {"train": "data/text.jsonl", "format": "alpaca"}}, "text.jsonl:1: missing field(s) ['instruction', 'output']"),
        ({"model": "./no-such-model"}, "model folder not found: ./no-such-model"),
        ({"model": "modelscope:org/model"}, "modelscope package is not installed"),
        ({"batch_size": 600}, "fewer than one step"),
        ({"lr": -1}, "cannot read the train config"),
    ],
)
def test_setup_errors_exit_2_with_one_line(assets: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog,
                                          restore_signals, overrides: dict, message: str) -> None:
    monkeypatch.chdir(assets)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_config(tmp_path, base_config(**overrides))
    assert train.main(["--config", str(tmp_path / "train.json"), "--out", str(tmp_path)]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and message in errors[0] and "\n" not in errors[0]


def test_an_unreachable_hub_fails_fast_instead_of_hanging(assets: Path, tmp_path: Path) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = base_config(model="someone/some-model")
    result = run(tmp_path, cfg, assets, nproc=None, timeout=120,
                 HF_HUB_OFFLINE="0", HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf"))
    assert result.returncode == 2, result.stdout
    assert f"cannot reach the Hugging Face endpoint http://127.0.0.1:{port} to download someone/some-model" in result.stdout


def test_an_uncached_hub_id_with_hf_hub_offline_is_a_clear_error(assets: Path, tmp_path: Path) -> None:
    result = run(tmp_path, base_config(model="someone/some-model"), assets, nproc=None, HF_HOME=str(tmp_path / "hf"))
    assert result.returncode == 2
    assert "model someone/some-model is not in the local Hugging Face cache and HF_HUB_OFFLINE is set" in result.stdout

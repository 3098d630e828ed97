"""A sweep is validated whole before anything is sent: a bad value is exit 2 naming the
combination, the field and where the value was given, with nothing submitted and nothing
synced; the other mistakes of the command line are exit 2 too, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.orch import Orch

JOB = """\
name: tiny
hosts: [{host}]
workspace: {{path: ws}}
train:
  model: assets/m
  data: {{train: assets/t.jsonl}}
sweep:
  train.lora.r: [8, 16]
"""


def job(orch: Orch, host: str, text: str = JOB) -> Path:
    (orch.cwd / "ws" / "assets").mkdir(parents=True, exist_ok=True)
    path = orch.cwd / "job.yaml"
    path.write_text(text.format(host=host))
    return path


def nothing_sent(orch: Orch, stderr: str = "") -> None:
    """No job recorded, nothing on the host, no connection even tried."""
    assert "connecting" not in stderr and "syncing" not in stderr
    assert orch.json("status") == []
    assert not (orch.remote_root / "workspace").exists() and not (orch.remote_root / "jobs").exists()


def test_a_bad_flag_value_is_exit_2_naming_the_combination_and_nothing_is_sent(orch: Orch, box: str) -> None:
    job(orch, box)
    out = orch("submit", "job.yaml", "--sweep", "train.lr=1e-4,abc", check=2)
    assert out.stderr.splitlines() == [
        "error: --sweep train.lr: combination 2 (train.lora.r=8, train.lr=abc): train.lr: must be a number > 0 "
        "(got 'abc')",
        "--sweep train.lr: combination 4 (train.lora.r=16, train.lr=abc): train.lr: must be a number > 0 (got 'abc')"]
    nothing_sent(orch, out.stderr)


def test_a_bad_block_value_points_at_it_in_the_file(orch: Orch, box: str) -> None:
    job(orch, box, JOB.replace("[8, 16]", "[8, -1]") + "  train.lr: [1e-4, 3e-4]\n")
    out = orch("submit", "job.yaml", check=2)
    assert out.stderr.splitlines() == [
        "error: job.yaml:8:21: combination 3 (train.lora.r=-1, train.lr=1e-4): train.lora.r: must be a positive "
        "integer (got -1)",
        "job.yaml:8:21: combination 4 (train.lora.r=-1, train.lr=3e-4): train.lora.r: must be a positive integer "
        "(got -1)"]
    assert "Traceback" not in out.stderr
    nothing_sent(orch, out.stderr)


def test_a_combination_the_laptop_checks_refuse_is_named_too(orch: Orch, box: str) -> None:
    job(orch, box, JOB + "  train.precision: [fp32, fp16]\n  train.strategy: [fsdp]\n")
    out = orch("submit", "job.yaml", check=2)
    assert "combination 2 (train.lora.r=8, train.precision=fp16, train.strategy=fsdp): " in out.stderr
    assert "combination 1 " not in out.stderr and "combination 3 " not in out.stderr
    nothing_sent(orch, out.stderr)


@pytest.mark.parametrize("args, words", [
    (["--sweep", "hosts=a,b"], "hosts cannot be swept"),
    (["--sweep", "train.lr"], "write KEY=VALUE1,VALUE2"),
    (["--sweep", "train.lr=1", "--sweep", "train.lr=2"], "--sweep train.lr is given twice"),
    (["--sweep", "train.lora=1", "--sweep", "train.lora.r=2"], "inside it"),
    (["--sweep", "train.lr=1e-4", "--follow"], "a sweep starts several"),
    (["--sweep", "train.lr=1e-4", "--sweep-name", "Bad Name"], "--sweep-name 'Bad Name'"),
    (["--sweep-name", "x"], None),
    (["--only", "9"], "--only 9: the sweep has 2 combination(s)"),
    (["--only", "2-x"], "--only '2-x': give combination numbers from 1 and ranges"),
    (["--hosts", "box,,box"], "--hosts 'box,,box': give host names separated by commas"),
    (["--hosts", "nosuch"], "nosuch"),
])
def test_command_line_mistakes_are_exit_2(orch: Orch, box: str, args: list[str], words: str | None) -> None:
    if words is None:  # --sweep-name without a sweep
        job(orch, box, JOB.split("sweep:")[0])
        words = "--sweep-name names a sweep"
    else:
        job(orch, box)
    out = orch("submit", "job.yaml", *args, check=2)
    assert words in out.stderr and "Traceback" not in out.stderr
    nothing_sent(orch, out.stderr)


def test_orch_check_names_a_bad_sweep_block_by_line(orch: Orch) -> None:
    job(orch, "local", JOB + "  hosts: [a]\n  env.X: []\n  train.lr: [1e-4, 1e-4]\n")
    err = orch("check", "job.yaml", check=2).stderr
    assert "job.yaml:9:10: sweep.hosts: hosts cannot be swept: `hosts:` is the pool" in err
    assert "job.yaml:10:10: sweep.env.X: must be a list with at least 1 item (got an empty list)" in err


def test_status_and_plot_of_an_unknown_sweep_are_exit_2(orch: Orch) -> None:
    assert "no sweep 'nope' (none yet" in orch("status", "--sweep", "nope", check=2).stderr
    assert "no sweep 'nope'" in orch("plot", "--sweep", "nope", check=2).stderr
    assert "give a JOB" in orch("plot", check=2).stderr
    assert "not both" in orch("status", "x", "--sweep", "nope", check=2).stderr


def test_an_env_key_the_job_file_does_not_set_is_warned_about(orch: Orch) -> None:
    path = orch.cwd / "own.yaml"
    (orch.cwd / "ws").mkdir(exist_ok=True)
    path.write_text("name: own\nhosts: [local]\nworkspace: {path: ws}\nenv: {LR: '1e-4'}\n"
                    "launch: {command: [python, -c, pass]}\n")
    out = orch("submit", str(path), "--sweep", "env.LRR=1e-4,3e-4", "--dry-run")
    assert "warning: env.LRR: the job file's env: has no LRR (a typo? set: LR)" in out.stderr
    assert "warning" not in orch("submit", str(path), "--sweep", "env.LR=1e-4,3e-4", "--dry-run").stderr

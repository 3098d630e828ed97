"""`orch check` on a built-in trainer job: data.mix weights and formats, the mix files and the
data.transform module synced (nothing of the module imported), with file:line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.orch import Orch

JOB = """\
name: mixed
hosts: [local]
workspace: {{path: ws}}
train:
  model: tiny
  data:
    mix:
      - {{train: data/a.jsonl, weight: {wa}, format: {fa}}}
      - {{train: data/b.jsonl, weight: 0.3, format: text, eval: data/b-eval.jsonl}}
    transform: "aug.ops:augment"
"""


@pytest.fixture
def ws(orch: Orch) -> Path:
    """data/{a,b,b-eval}.jsonl and aug/ops.py, which raises when imported (the laptop must not import it)."""
    root = orch.cwd / "ws"
    (root / "data").mkdir(parents=True)
    (root / "aug").mkdir()
    for name in ("a", "b", "b-eval"):
        (root / "data" / f"{name}.jsonl").write_text('{"text": "x"}\n')
    (root / "aug" / "__init__.py").write_text("")
    (root / "aug" / "ops.py").write_text("raise SystemExit('imported on the laptop')\ndef augment(e, rng):\n    return e\n")
    return root


def job(orch: Orch, wa: object = 0.7, fa: str = "alpaca") -> Path:
    path = orch.cwd / "job.yaml"
    path.write_text(JOB.format(wa=wa, fa=fa))
    return path


def check_fails(orch: Orch, spec: Path) -> str:
    out = orch("check", str(spec), check=2)
    assert "Traceback" not in out.stderr and out.stdout == ""
    return out.stderr


def test_a_synced_mixture_and_transform_pass(orch: Orch, ws: Path) -> None:
    out = orch("check", str(job(orch)))
    assert "ok — job 'mixed'" in out.stdout and "warning" not in out.stderr


@pytest.mark.parametrize(("wa", "fa", "expected"), [
    (0, "alpaca", "job.yaml:8:"),
    (-1, "alpaca", "job.yaml:8:"),
    (0.7, "sharegpt", "job.yaml:8:"),
])
def test_bad_weights_and_formats_are_exit_2_at_their_line(orch: Orch, ws: Path, wa: object, fa: str, expected: str) -> None:
    err = check_fails(orch, job(orch, wa, fa))
    assert expected in err and ("train.data.mix.0.weight" in err or "train.data.mix.0.format" in err), err


def test_a_mix_file_missing_or_excluded_is_exit_2_naming_it(orch: Orch, ws: Path) -> None:
    (ws / "data" / "b.jsonl").unlink()
    err = check_fails(orch, job(orch))
    assert f"job.yaml:9:17: train.data.mix[1].train: data/b.jsonl is not in the workspace {ws}" in err, err
    (ws / "data" / "b.jsonl").write_text('{"text": "x"}\n')
    (ws / ".gitignore").write_text("*-eval.jsonl\n")
    err = check_fails(orch, job(orch))
    assert "job.yaml:9:" in err and "train.data.mix[1].eval:" in err and ".gitignore:1" in err, err
    assert "add '!data/" in err and "to .orchignore" in err  # the line that brings it back


def test_the_transform_module_must_be_synced_and_is_never_imported(orch: Orch, ws: Path) -> None:
    (ws / "aug" / "ops.py").rename(ws / "aug" / "opz.py")
    err = check_fails(orch, job(orch))
    assert (f"job.yaml:10:16: train.data.transform: aug/ops.py or aug/ops/__init__.py is not in the workspace {ws} "
            "(did you mean 'aug/opz.py'?)") in err, err
    (ws / "aug" / "opz.py").rename(ws / "aug" / "ops.py")
    (ws / ".orchignore").write_text("aug/\n")
    err = check_fails(orch, job(orch))
    assert "job.yaml:10:16: train.data.transform: aug/ops.py" in err and ".orchignore:1 'aug/'" in err, err


def test_a_missing_data_train_file_only_warns(orch: Orch, ws: Path) -> None:
    text = "name: one\nhosts: [local]\nworkspace: {path: ws}\ntrain:\n  model: tiny\n  data: {train: data/nope.jsonl}\n"
    (orch.cwd / "job.yaml").write_text(text)
    out = orch("check", str(orch.cwd / "job.yaml"))
    assert "ok — job 'one'" in out.stdout
    assert f"job.yaml:6:17: train.data.train: data/nope.jsonl is not in the workspace {ws}" in out.stderr


def test_a_transform_not_of_the_module_function_form_is_exit_2(orch: Orch, ws: Path) -> None:
    (orch.cwd / "job.yaml").write_text(JOB.format(wa=0.7, fa="alpaca").replace('"aug.ops:augment"', '"aug.ops"'))
    err = check_fails(orch, orch.cwd / "job.yaml")
    assert ("job.yaml:10:16: train.data.transform: write module:function, a function of a module of the workspace, "
            "e.g. augment.templates:vary (got 'aug.ops')") in err, err

"""`orch check` warnings (exit 0) about what launch.command's arguments name: files and folders
the ignore rules leave out (the rule and the .orchignore line that brings them — which then
works), relative paths that are nowhere, no word about what can only be the server's or a
name; and about outputs: that orch fetch would miss."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.orch import Orch


def job(orch: Orch, command: list[str], outputs: list[str] | None = ["out/"], setup: str = "") -> Path:
    """job.yaml with launch.command (a list) on line 6, outputs: on line 7 unless None."""
    path = orch.cwd / "job.yaml"
    path.write_text("name: nano\nhosts: [local]\nworkspace:\n  path: ws\nlaunch:\n"
                    f"  command: {json.dumps(command)}\n"
                    + (f"outputs: {json.dumps(outputs)}\n" if outputs is not None else "")
                    + (f"setup: {json.dumps(setup)}\n" if setup else ""))
    return path


@pytest.fixture
def ws(orch: Orch) -> Path:
    """nanoGPT's layout: `*.bin` on line 6 of .gitignore; data/synth/{prepare.py,train.bin,val.bin}."""
    root = orch.cwd / "ws"
    for rel, text in {"train.py": "print(1)\n", "data/synth/prepare.py": "print(2)\n",
                      "data/synth/train.bin": "t" * 100, "data/synth/val.bin": "v" * 10,
                      "config/train_synth.py": "x = 1\n", "data/raw/a.txt": "a"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / ".gitignore").write_text("# from nanoGPT\n__pycache__/\n.DS_Store\n\nraw/\n*.bin\n")
    return root


def warnings(orch: Orch, spec: Path) -> list[str]:
    out = orch("check", str(spec))
    assert "ok — job 'nano'" in out.stdout and "Traceback" not in out.stderr
    return [line for line in out.stderr.splitlines() if line.startswith("orch: warning: ")]


@pytest.mark.parametrize("args, column, said", [
    (["--data=data/synth/train.bin"], 35,
     "data/synth/train.bin is excluded by .gitignore:6 '*.bin'; add '!data/synth/*.bin' to .orchignore "
     "(the job will not find it)"),
    (["--data", "data/synth/val.bin"], 45,
     "data/synth/val.bin is excluded by .gitignore:6 '*.bin'; add '!data/synth/*.bin' to .orchignore"),
    (["--data_dir=data/synth"], 35,
     "data/synth/ holds 2 file(s) that are not synced (train.bin, val.bin), excluded by .gitignore:6 '*.bin'; "
     "add '!data/synth/*.bin' to .orchignore (the job will not find them)"),
    (["dataset=data/raw"], 35, "data/raw is excluded by .gitignore:5 'raw/'; add '!data/raw/' to .orchignore"),
    (["data/raw/a.txt"], 35, "data/raw/a.txt is not synced: its folder data/raw/ is excluded by .gitignore:5 'raw/'; "
                             "add '!data/raw/' to .orchignore"),
])
def test_an_argument_naming_excluded_files_names_the_rule_and_the_line_that_brings_them(
        orch: Orch, ws: Path, args: list[str], column: int, said: str) -> None:
    spec = job(orch, ["python", "train.py", *args])
    found = warnings(orch, spec)
    assert len(found) == 1 and f"job.yaml:6:{column}: launch.command: {said}" in found[0]
    lines = re.findall(r"add ((?:'[^']+'(?: and )?)+) to \.orchignore", found[0])[0]
    (ws / ".orchignore").write_text("".join(line + "\n" for line in re.findall(r"'([^']+)'", lines)))
    assert warnings(orch, spec) == []  # the advice works


def test_a_relative_path_that_is_nowhere_is_a_warning_with_a_guess(orch: Orch, ws: Path) -> None:
    found = warnings(orch, job(orch, ["python", "train.py", "--data=data/synth/trian.bin", "config/missing.yaml"]))
    assert len(found) == 2
    assert (f"launch.command: data/synth/trian.bin is not in the workspace {ws} (did you mean "
            "'data/synth/train.bin'?), nor left out by an ignore rule: the job will not find it unless it makes it"
            ) in found[0]
    assert "job.yaml:6:66: launch.command: config/missing.yaml is not in the workspace" in found[1]


@pytest.mark.parametrize("args", [
    ["config/train_synth.py", "--data=data/synth/prepare.py", "--dir", "config/"],  # synced
    ["--data=/data/synth/train.bin", "/root/autodl-tmp/x.bin"],  # the server's own paths
    ["--model", "meta-llama/Llama-2-7b-hf", "--tok=Qwen/Qwen2.5-0.5B", "gpt2"],  # model ids
    ["--lr=3e-4", "--batch_size", "12", "--compile=False", "--rdzv", "host:29500"],
    ["--out_dir=out", "--save_path", "out/ckpt.pt", "--log-dir=out/tb"],  # outputs the job writes
    ["$DATA/train.bin", "~/x.bin", "https://example.com/a/b.bin", "../elsewhere/x.bin", "data/*.bin"],
    ["--data=made/by_setup.bin"],
])
def test_no_word_about_paths_that_are_synced_the_servers_names_or_outputs(orch: Orch, ws: Path,
                                                                          args: list[str]) -> None:
    assert warnings(orch, job(orch, ["python", "train.py", *args], setup="python make.py > by_setup.bin")) == []


def test_submit_warns_the_same_and_goes_on(orch: Orch, ws: Path) -> None:
    out = orch("submit", str(job(orch, ["python", "train.py", "--data=data/synth/train.bin"])), "--dry-run")
    assert "orch: warning: " in out.stderr and "add '!data/synth/*.bin' to .orchignore" in out.stderr
    assert json.loads(out.stdout)["nodes"]


def test_outputs_left_at_the_default_is_a_warning_that_says_where_relative_paths_land(orch: Orch, ws: Path) -> None:
    found = warnings(orch, job(orch, ["python", "train.py"], outputs=None))
    assert len(found) == 1
    assert ("job.yaml:6:12: outputs: is the default (outputs/, logs/, metrics.jsonl): the script runs in the job's "
            "code/ folder, and what it writes to a relative path (out/ckpt.pt) is fetched only if outputs: names it "
            "by that path: write outputs: in the job file, e.g. outputs: [out/, logs/, metrics.jsonl]") in found[0]
    assert warnings(orch, job(orch, ["python", "train.py"], outputs=["outputs/", "logs/", "metrics.jsonl"])) == []


def test_an_output_folder_that_outputs_does_not_select_is_named(orch: Orch, ws: Path) -> None:
    found = warnings(orch, job(orch, ["python", "train.py", "--out_dir=out-synth"], outputs=None))
    assert len(found) == 1
    assert ("job.yaml:6:35: outputs: the job writes out-synth (--out_dir) in its working directory (code/), which "
            "outputs: (outputs/, logs/, metrics.jsonl) does not select, so orch fetch will not bring it back: add "
            "'out-synth/' to outputs:") in found[0]
    assert warnings(orch, job(orch, ["python", "train.py", "--out_dir=out-synth"], outputs=["out-synth/"])) == []


def test_the_built_in_trainer_gets_no_outputs_warning(orch: Orch) -> None:
    (orch.cwd / "ws").mkdir()
    (orch.cwd / "ws" / "d.jsonl").write_text('{"text": "x"}\n')  # present: a missing one is warned of (traindata.py)
    spec = orch.cwd / "job.yaml"
    spec.write_text("name: nano\nhosts: [local]\nworkspace: {path: ws}\ntrain: {model: gpt2, data: {train: d.jsonl}}\n")
    assert warnings(orch, spec) == []

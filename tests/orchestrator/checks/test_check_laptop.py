"""What `orch check` (and `orch submit`, before connecting) knows on the laptop: a missing
workspace, a launch.command script or module that will not be synced (naming the ignore rule),
and a setup script too large for one exec that now simply runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.orch import Orch, write_job


def job(orch: Orch, command: str | list[str], workspace: str = "ws", exclude: list[str] | None = None,
        outputs: list[str] | None = ["out/"]) -> Path:
    """job.yaml whose launch.command is on line 7 (``command:`` at column 3), with ``outputs:``
    on line 8 unless None (left at its default)."""
    path = orch.cwd / "job.yaml"
    path.write_text(f"name: lap\nhosts: [local]\nworkspace:\n  path: {workspace}\n  exclude: {json.dumps(exclude or [])}\n"
                    f"launch:\n  command: {json.dumps(command)}\n"
                    + (f"outputs: {json.dumps(outputs)}\n" if outputs is not None else ""))
    return path


@pytest.fixture
def ws(orch: Orch) -> Path:
    """A workspace: train.py, pkg/{__init__,a}.py, tools/__main__.py, run.sh, data/gen.py
    (ignored by .gitignore), secret.py (.orchignore), local.py (workspace.exclude)."""
    root = orch.cwd / "ws"
    for rel in ["train.py", "pkg/__init__.py", "pkg/a.py", "tools/__main__.py", "run.sh", "data/gen.py",
                "secret.py", "local.py", "keep.py"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("print('hi')\n")
    (root / ".gitignore").write_text("# generated\ndata/\n*.py[co]\n")
    (root / ".orchignore").write_text("secret.py\nkeep*.py\n!keep.py\n")
    return root


def check_fails(orch: Orch, spec: Path) -> str:
    out = orch("check", str(spec), check=2)
    assert "Traceback" not in out.stderr and out.stdout == ""
    return out.stderr


@pytest.mark.parametrize("make, what", [(None, "does not exist"), ("file", "is not a folder")])
def test_a_workspace_that_is_not_a_folder_is_exit_2_with_the_line_and_the_resolved_path(
        orch: Orch, make: str | None, what: str) -> None:
    if make == "file":
        (orch.cwd / "notdir").write_text("x")
    err = check_fails(orch, job(orch, "python train.py", workspace="notdir"))
    assert f"job.yaml:4:9: workspace.path: {orch.cwd / 'notdir'} {what}" in err


@pytest.mark.parametrize("command, line", [
    ("python trian.py", "trian.py is not in the workspace {ws} (did you mean 'train.py'?)"),
    ("python3 -u missing.py --x 1", "missing.py is not in the workspace {ws}"),
    ("python -W ignore -X dev missing.py", "missing.py is not in the workspace {ws}"),
    ("python -m pkg.b", "-m pkg.b needs pkg/b.py or pkg/b/__main__.py; the workspace {ws} has pkg/ but neither"),
    ("python -m pkg", "-m pkg needs pkg.py or pkg/__main__.py; the workspace {ws} has pkg/ but neither"),
    ("bash other.sh", "other.sh is not in the workspace {ws}"),
    ("sh -e -o pipefail other.sh", "other.sh is not in the workspace {ws}"),
    ("./missing.sh --fast", "./missing.sh is not in the workspace {ws}"),
    ("torchrun --nproc_per_node 2 --standalone missing.py --lr 1", "missing.py is not in the workspace {ws}"),
    ("torchrun --nnodes=1 -m pkg.b", "-m pkg.b needs pkg/b.py"),
    ("accelerate launch --multi_gpu --num_processes 2 missing.py", "missing.py is not in the workspace {ws}"),
    ("cd pkg && A=1 python missing.py", "pkg/missing.py is not in the workspace {ws}"),  # below cd's folder
])
def test_a_command_whose_script_is_missing_is_exit_2(orch: Orch, ws: Path, command: str, line: str) -> None:
    err = check_fails(orch, job(orch, command))
    assert f"job.yaml:7:12: launch.command: {line.format(ws=ws)}" in err


def test_a_list_command_points_at_the_argument(orch: Orch, ws: Path) -> None:
    err = check_fails(orch, job(orch, ["python", "-u", "nope.py"]))
    assert "job.yaml:7:29: launch.command: nope.py is not in the workspace" in err


@pytest.mark.parametrize("command, exclude, reason", [
    ("python data/gen.py", [],
     "data/gen.py is not synced: its folder data/ is excluded by .gitignore:2 'data/'; add '!/data/' to .orchignore"),
    ("python -u secret.py", [], "secret.py is excluded by .orchignore:1 'secret.py'; add '!/secret.py' to .orchignore"),
    ("python local.py", ["local.py"],
     "local.py is excluded by workspace.exclude[0] 'local.py'; take 'local.py' out of workspace.exclude"),
    ("bash run.sh", ["*.sh"],
     "run.sh is excluded by workspace.exclude[0] '*.sh'; take '*.sh' out of workspace.exclude"),
    ("python keep.py", ["keep.py"],
     "keep.py is excluded by workspace.exclude[0] 'keep.py'; take 'keep.py' out of workspace.exclude"),
    ("python -m tools", ["tools/"], "module tools (tools/__main__.py) is not synced: its folder tools/ is excluded by "
                                    "workspace.exclude[0] 'tools/'; take 'tools/' out of workspace.exclude"),
])
def test_an_excluded_script_names_the_rule_and_where_it_is_written(orch: Orch, ws: Path, command: str,
                                                                    exclude: list[str], reason: str) -> None:
    """The last matching pattern decides (gitignore semantics): `!keep.py` in .orchignore
    re-includes keep.py, a later workspace.exclude excludes it again; a line of .orchignore
    cannot undo workspace.exclude (read after it), so the advice there is to take it out."""
    assert f"job.yaml:7:12: launch.command: {reason}" in check_fails(orch, job(orch, command, exclude=exclude))


@pytest.mark.parametrize("command", [
    "python train.py --lr 1e-4", "python3 -u keep.py", "python -m pkg.a", "python -m tools", "bash run.sh",
    "./run.sh", "torchrun --nproc_per_node 2 train.py", "accelerate launch --num_processes 2 train.py",
    "python -m http.server 8000", "python -m torch.distributed.run --standalone train.py", "python -m some_installed_tool",
    "python -c 'print(1)'", "bash -lc 'echo hi'", "python /opt/abs/train.py", "python ~/x.py", "python ../outside.py",
    "nvidia-smi", "true", "bash some-script-on-path", ".venv/bin/python train.py", "cd pkg && A=1 python a.py",
    "cd /opt/x && python y.py",
])
def test_commands_that_need_no_missing_workspace_file_pass(orch: Orch, ws: Path, command: str) -> None:
    out = orch("check", str(job(orch, command)))
    assert "ok — job 'lap'" in out.stdout and out.stderr == ""


def test_a_file_that_setup_makes_is_not_flagged(orch: Orch, ws: Path) -> None:
    spec = job(orch, "bash fetched.sh")
    spec.write_text(spec.read_text() + "setup: curl -o fetched.sh https://example.com/x\n")
    assert "ok" in orch("check", str(spec)).stdout


def test_submit_runs_the_same_checks_before_connecting(orch: Orch, ws: Path) -> None:
    # an inventory host on a closed port: connecting would be exit 3, never exit 2
    orch("hosts", "add", "dead", "--ssh", "ssh -p 1 root@127.0.0.1")
    spec = job(orch, "python trian.py")
    spec.write_text(spec.read_text().replace("[local]", "[dead]"))
    for args in (["submit", str(spec)], ["submit", str(spec), "--dry-run"]):
        out = orch(*args, check=2)
        assert "job.yaml:7:12: launch.command: trian.py is not in the workspace" in out.stderr
        assert "127.0.0.1" not in out.stderr
    assert orch.json("ls") == []


def test_a_300_kib_setup_script_runs_from_a_file(orch: Orch, host: str) -> None:
    """Over the kernel's 128 KiB limit for one exec argument: it used to fail on the server
    with "Argument list too long"; now setup runs from <job_dir>/setup.sh."""
    lines = [f": padding line {i:05d} " + "x" * 80 for i in range(3200)]
    script = "\n".join(lines + ['mkdir -p "$ORCH_JOB_DIR/outputs"', 'echo "setup ran" > "$ORCH_JOB_DIR/outputs/setup.txt"'])
    assert len(script.encode()) > 300 * 1024
    spec = write_job(orch.cwd, "bigsetup", host, ["python", "check.py"], f"setup: {json.dumps(script)}\n")
    (orch.cwd / "ws" / "check.py").write_text(
        "import os, pathlib\nprint('job saw:', (pathlib.Path(os.environ['ORCH_JOB_DIR']) / 'outputs' / 'setup.txt')"
        ".read_text().strip())\n")
    assert "ok" in orch("check", str(spec)).stdout
    done = orch("submit", str(spec), "--follow", "--json")
    result = json.loads(done.stdout)
    assert result["state"] == "succeeded"
    log = (orch.job_dir(result["job_id"]) / "logs" / "node0.log").read_text()
    assert "job saw: setup ran" in log and "Argument list too long" not in log
    assert (orch.job_dir(result["job_id"]) / "setup.sh").read_text().rstrip("\n") == script


def deepspeed_job(orch: Orch, deepspeed: str, precision: str = "auto") -> Path:
    """A built-in trainer job whose ``deepspeed:`` is on line 9 (the value at column 14)."""
    path = orch.cwd / "job.yaml"
    path.write_text(f"name: lap\nhosts: [local]\nworkspace:\n  path: ws\ntrain:\n  model: m\n  data: {{train: t.jsonl}}\n"
                    f"  strategy: deepspeed\n  deepspeed: {deepspeed}\n  precision: {precision}\n")
    return path


def test_a_deepspeed_json_file_is_checked_on_the_laptop_with_its_lines(orch: Orch, ws: Path) -> None:
    (ws / "ds.json").write_text('{\n  "zero_optimization": {"stage": 3,\n    "offload_param": {"device": "cpu"}},\n'
                                '  "fp16": {"enabled": true},\n  "gradient_accumulation_steps": 4,\n'
                                '  "optimizer": {"type": "AdamW"},\n  "zero_optimisation": {}\n}\n')
    err = check_fails(orch, deepspeed_job(orch, "ds.json"))
    where = "(train.deepspeed: " + str(orch.cwd / "job.yaml") + ":9:14)"
    ds = ws / "ds.json"
    assert f"{ds}:4: fp16.enabled: true, but train.precision is auto: set train.precision: fp16" in err
    assert f"{ds}:5: gradient_accumulation_steps: 4 differs from train.grad_accum (1)" in err
    assert f"{ds}:6: optimizer: not used by the built-in trainer" in err
    assert f"{ds}:7: zero_optimisation: not a DeepSpeed config key (did you mean zero_optimization?) {where}" in err

    (ws / "ds.json").write_text('{\n  "zero_optimization": {"stage": 1,\n    "offload_param": {"device": "cpu"}}\n}\n')
    err = check_fails(orch, deepspeed_job(orch, "{config: ds.json}"))
    assert f"{ds}:3: zero_optimization.offload_param: parameter offload needs ZeRO stage 3 (stage is 1)" in err

    (ws / "ds.json").write_text('{\n  "zero_optimization": {"stage": 2,}\n}\n')
    err = check_fails(orch, deepspeed_job(orch, "ds.json"))
    assert f"{ds}:2:36: not valid JSON: Expecting property name enclosed in double quotes" in err

    err = check_fails(orch, deepspeed_job(orch, "missing.json"))
    assert "job.yaml:9:14: train.deepspeed: cannot read missing.json in the workspace" in err

    (ws / "ds.json").write_text('{"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": "auto"},\n'
                                ' "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}\n')
    out = orch("check", str(deepspeed_job(orch, "ds.json", precision="bf16")), check=None)
    assert "train.deepspeed" not in out.stderr and "ds.json:" not in out.stderr, out.stderr

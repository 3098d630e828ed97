"""Sweeps with real jobs (issue 15): the built-in trainer on two hosts, a user's own script
reading its values from the environment and its argv, and ``--priority``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from unittest.mock import patch

from orchestrator.display.plot import legend_labels, overlay, parse_metrics
from orchestrator.state.registry import Registry
from orchestrator.trace import PHASE_WIDTH
from tests.support.orch import Orch

TERMINAL = ("succeeded", "failed", "cancelled", "lost")

TRAINER_JOB = """\
name: tiny
hosts: [{box}, {box2}]
workspace: {{path: ws}}
launch: {{nproc_per_node: 1}}
train:
  model: assets/tiny-gpt2
  finetune: lora
  lora: {{r: 4, dropout: 0.0, target_modules: [c_attn]}}
  data: {{train: assets/data/train.jsonl, eval: assets/data/eval.jsonl, max_length: 48}}
  precision: fp32
  batch_size: 2
  max_steps: 4
  eval_every: 2
  log_every: 1
  save_every: 100
sweep:
  train.lora.r: [2, 8]
"""


def trainer_workspace(orch: Orch, assets: Path) -> None:
    shutil.copytree(assets, orch.cwd / "ws" / "assets")


def metrics_of(job_dir: Path) -> list[dict[str, float]]:
    return parse_metrics((job_dir / "metrics.jsonl").read_text())


def test_a_sweep_of_4_combinations_on_2_hosts_completes_with_the_right_values(
        orch: Orch, box: str, box2: str, tiny_assets: Path) -> None:
    trainer_workspace(orch, tiny_assets)
    (orch.cwd / "job.yaml").write_text(TRAINER_JOB.format(box=box, box2=box2))
    jobs = orch.json("submit", "job.yaml", "--sweep", "train.lr=1e-3,3e-3", "--sweep-name", "lr-r")
    wanted = [(2, 1e-3), (2, 3e-3), (8, 1e-3), (8, 3e-3)]  # the block's key first, the flag's after it
    assert [(j["combination"], j["host"], j["values"]) for j in jobs] == [
        (i, host, {"train.lora.r": r, "train.lr": lr})
        for i, host, (r, lr) in zip(range(1, 5), ["box", "box2", "box", "box2"], wanted)]
    ids = [j["job_id"] for j in jobs]
    for job_id in ids:
        assert orch.wait_state(job_id, TERMINAL, timeout=600)["state"] == "succeeded", orch("logs", job_id).stdout

    dirs = [orch.job_dir(job_id) for job_id in ids]
    assert [d.parent.parent for d in dirs] == [orch.remote_root, orch.remote_root / "box2"] * 2
    for job_dir, (r, lr) in zip(dirs, wanted):  # what each trainer ran with: its values, nothing else
        ran = json.loads((job_dir / "train.json").read_text())
        assert (ran["lr"], ran["lora"]["r"], ran["max_steps"]) == (lr, r, 4)
        assert json.loads((job_dir / "outputs" / "adapter_config.json").read_text())["r"] == r

    shown = orch.json("show", ids[3])
    assert shown["spec_resolved"]["train"]["lr"] == 3e-3 and shown["spec_resolved"]["hosts"] == ["box2"]
    assert shown["sweep"] == {"name": "lr-r", "combination": 4, "combinations": 4,
                              "values": {"train.lora.r": 8, "train.lr": 3e-3}}
    text = orch("show", ids[3]).stdout
    assert "sweep:    lr-r, combination 4 of 4\nvalues:   train.lora.r=8, train.lr=3e-3\n" in text
    assert "# orch sweep lr-r: combination 4 of 4 on box2: train.lora.r=8, train.lr=3e-3" in text

    best = [min(r["eval_loss"] for r in metrics_of(d) if "eval_loss" in r) for d in dirs]
    final = [[r["loss"] for r in metrics_of(d) if "loss" in r][-1] for d in dirs]
    table = orch("status", "--sweep", "lr-r", env={"COLUMNS": "80"}).stdout.splitlines()
    assert all(len(line) <= 80 for line in table) and len(table) == 6
    assert table[0].split()[:6] == ["#", "r", "lr", "STATE", "BEST", "EVAL"]
    for line, (r, lr), b, f, host in zip(table[1:5], [(2, "1e-3"), (2, "3e-3"), (8, "1e-3"), (8, "3e-3")], best,
                                          final, ["box", "box2"] * 2):
        assert line.split()[:7] == [line.split()[0], str(r), lr, "succeeded", f"{b:.4f}", f"{f:.4f}", "4/4"]
        assert line.split()[7] == host
    winner = min(range(4), key=lambda i: best[i])
    assert table[5] == f"4 combinations: 4 succeeded; best eval {best[winner]:.4f} (#{winner + 1})"
    rows = orch.json("status", "--sweep", "lr-r")
    assert [(r["combination"], r["best_eval_loss"], r["loss"]) for r in rows] == list(zip(range(1, 5), best, final))

    plotted = orch("plot", "--sweep", "lr-r")
    png = orch.cwd / "runs" / "lr-r" / "curves.png"
    assert plotted.stdout.strip() == str(Path("runs") / "lr-r" / "curves.png") and png.read_bytes()[:4] == b"\x89PNG"
    labels = ["r=2, lr=1e-3", "r=2, lr=3e-3", "r=8, lr=1e-3", "r=8, lr=3e-3"]
    assert all(f"{label}: read " in plotted.stderr for label in labels)
    registry = Registry(orch.home)  # the legend as the plotting code makes it
    assert legend_labels(ids, registry.sweep_entries(ids)) == (labels, "sweep lr-r")
    fig = overlay([(label, metrics_of(d)) for label, d in zip(labels, dirs)], "lr-r", "sweep lr-r")
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == labels
    assert len(fig.axes) == 2 and fig.axes[0].get_legend().get_title().get_text() == "sweep lr-r"

    orch("hosts", "rm", "box")  # finished jobs: the table comes from the registry, no host asked
    orch("hosts", "rm", "box2")
    assert orch("status", "--sweep", "lr-r", env={"COLUMNS": "80"}).stdout.splitlines() == table


OWN_SCRIPT = """\
import json, os, sys
os.makedirs("outputs", exist_ok=True)
with open("outputs/got.json", "w") as f:
    json.dump({"argv": sys.argv[1:], "LR": os.environ.get("LR"), "WARMUP": os.environ.get("WARMUP")}, f)
lr = float(os.environ.get("LR", "1"))
with open(os.environ["ORCH_METRICS"], "a") as f:
    for step in (1, 2, 3):
        f.write(json.dumps({"step": step, "loss": lr * 1000 / step}) + "\\n")
    f.write(json.dumps({"step": 3, "eval_loss": lr * 100}) + "\\n")
"""

OWN_JOB = """\
name: own
hosts: [local]
workspace: {path: ws}
launch:
  nproc_per_node: 1
  command: [python, got.py, --epochs, "1"]
env: {WARMUP: "5"}
sweep:
  env.LR: [1e-4, 3e-4]     # read by the script
"""


def test_an_own_script_gets_its_env_and_argv_values_and_a_rerun_repeats_them(orch: Orch) -> None:
    (orch.cwd / "ws").mkdir()
    (orch.cwd / "ws" / "got.py").write_text(OWN_SCRIPT)
    (orch.cwd / "job.yaml").write_text(OWN_JOB)
    jobs = orch.json("submit", "job.yaml", "--sweep", "launch.command.3=2,3", "--sweep-name", "own-1")
    assert [j["values"] for j in jobs] == [{"env.LR": "1e-4", "launch.command.3": "2"},
                                           {"env.LR": "1e-4", "launch.command.3": "3"},
                                           {"env.LR": "3e-4", "launch.command.3": "2"},
                                           {"env.LR": "3e-4", "launch.command.3": "3"}]
    for job in jobs:
        assert orch.wait_state(job["job_id"], TERMINAL)["state"] == "succeeded"
        got = json.loads((orch.job_dir(job["job_id"]) / "code" / "outputs" / "got.json").read_text())
        assert got == {"argv": ["--epochs", job["values"]["launch.command.3"]], "LR": job["values"]["env.LR"],
                       "WARMUP": "5"}

    again = orch("submit", "job.yaml", "--sweep", "launch.command.3=2,3", "--sweep-name", "own-1")
    assert [line.split()[0] for line in again.stdout.splitlines()] == [j["job_id"] for j in jobs]  # nothing launched twice
    assert again.stderr.count("started by an earlier submit of sweep own-1: skipped") == 4
    assert "): started " not in again.stderr and len(orch.json("status")) == 4  # no launch said
    other = orch("submit", "job.yaml", "--sweep-name", "own-1", check=2)
    assert "sweep own-1 already holds other combinations" in other.stderr

    rerun = orch.json("rerun", jobs[3]["job_id"])  # the recorded file is that job alone
    assert orch.wait_state(rerun["job_id"], TERMINAL)["state"] == "succeeded"
    got = json.loads((orch.job_dir(rerun["job_id"]) / "code" / "outputs" / "got.json").read_text())
    assert got == {"argv": ["--epochs", "3"], "LR": "3e-4", "WARMUP": "5"}

    table = orch("status", "--sweep", "own-1").stdout.splitlines()
    assert [line.split()[:5] for line in table[1:5]] == [
        ["1", "1e-4", "2", "succeeded", "0.0100"], ["2", "1e-4", "3", "succeeded", "0.0100"],
        ["3", "3e-4", "2", "succeeded", "0.0300"], ["4", "3e-4", "3", "succeeded", "0.0300"]]
    assert table[0].split()[:3] == ["#", "LR", "command.3"]


def test_priority_sets_launch_priority_alone_and_for_every_job_of_a_sweep(orch: Orch) -> None:
    (orch.cwd / "ws").mkdir()
    (orch.cwd / "ws" / "got.py").write_text(OWN_SCRIPT)
    (orch.cwd / "job.yaml").write_text(OWN_JOB.split("sweep:")[0])
    one = orch.json("submit", "job.yaml", "--priority", "7", "--sweep", "env.LR=1e-4")[0]["job_id"]
    alone = orch.json("submit", "job.yaml", "--priority", "-3")
    for job_id, priority in [(one, 7), (alone["job_id"], -3)]:
        orch.wait_state(job_id, TERMINAL)
        assert orch.json("show", job_id)["spec_resolved"]["launch"]["priority"] == priority
    assert "# orch submit --priority: launch.priority=-3" in orch("show", alone["job_id"]).stdout
    bad = orch("submit", "job.yaml", "--priority", "2000000", check=2)
    assert bad.stderr.startswith("error: --priority: launch.priority: must be an integer from -1000000 to 1000000")
    with patch.dict(os.environ, {"ORCH_HOME": str(orch.home)}):
        assert Registry(orch.home).sweep_entries([alone["job_id"]]) == {}


def trace_lines(stderr: str) -> list[tuple[str, str]]:
    """(phase, detail) of each ``ORCH_TRACE`` line (``orch-trace PID  +  12.3 ms  PHASE  detail``)."""
    return [(rest[:PHASE_WIDTH].strip(), rest[PHASE_WIDTH:].strip()) for rest in
            (line.split(" ms  ", 1)[1] for line in stderr.splitlines() if line.startswith("orch-trace "))]


def test_an_unchanged_sweep_resubmit_takes_the_set_apart_fast_path_as_a_lone_job_does(
        orch: Orch, box: str, box2: str) -> None:
    (orch.cwd / "ws").mkdir()
    (orch.cwd / "ws" / "got.py").write_text(OWN_SCRIPT)
    (orch.cwd / "job.yaml").write_text(OWN_JOB.replace("hosts: [local]", f"hosts: [{box}, {box2}]"))
    first = orch("submit", "job.yaml", "--sweep-name", "fast-1", env={"ORCH_TRACE": "1"})
    sent = [detail for phase, detail in trace_lines(first.stderr) if phase == "send"]
    assert len(sent) == 2, first.stderr  # each host received the workspace once
    again = orch("submit", "job.yaml", "--sweep-name", "fast-2", env={"ORCH_TRACE": "1"})
    phases = trace_lines(again.stderr)
    assert sorted(d.split(":")[0] for p, d in phases if p == "stage") == ["box", "box2"], again.stderr
    assert all("set apart from the server's record in hello" in d for p, d in phases if p == "stage")
    assert [p for p, _ in phases if p == "send"] == [], again.stderr  # nothing received: no sync stream
    for line in first.stdout.splitlines() + again.stdout.splitlines():
        job_id = line.split()[0]
        assert orch.wait_state(job_id, TERMINAL)["state"] == "succeeded", orch("logs", job_id).stdout
        got = json.loads((orch.job_dir(job_id) / "code" / "outputs" / "got.json").read_text())
        assert got["LR"] in ("1e-4", "3e-4") and got["argv"] == ["--epochs", "1"]
    (orch.cwd / "lone.yaml").write_text(OWN_JOB.split("sweep:")[0].replace("hosts: [local]", f"hosts: [{box}]"))
    lone = orch("submit", "lone.yaml", env={"ORCH_TRACE": "1"})  # the same sequence, the same record of box
    phases = trace_lines(lone.stderr)
    assert [d.split(":")[0] for p, d in phases if p == "stage"] == ["box"] and "send" not in [p for p, _ in phases]
    assert orch.wait_state(lone.stdout.split()[0], TERMINAL)["state"] == "succeeded"

"""Trackers' folders come back with `orch fetch` when outputs: names them (TensorBoard's runs/,
W&B's offline wandb/), and `--wandb-sync` hands the fetched offline runs to the laptop's
`wandb sync` — or says that wandb is not installed."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.support.orch import Orch, write_job

SCRIPT = """\
import os, pathlib
from torch.utils.tensorboard import SummaryWriter
board = SummaryWriter("runs/exp1")                      # as HF Trainer's report_to tensorboard does
for step in range(3):
    board.add_scalar("train/loss", 3.0 - step, step)
board.close()
run = pathlib.Path("wandb/offline-run-20261205_101010-abc123")   # what WANDB_MODE=offline leaves
(run / "files").mkdir(parents=True)
(run / "run-abc123.wandb").write_bytes(b"W&B" * 100)
(run / "files" / "config.yaml").write_text("lr: 0.1\\n")
os.symlink(run.name, "wandb/latest-run")
"""

RECORDER = """\
#!{python}
import json, os, sys
with open(os.environ["WANDB_ARGV_FILE"], "a") as f:
    f.write(json.dumps(sys.argv) + "\\n")
print("Syncing: fake")
sys.exit(int(os.environ.get("WANDB_EXIT", "0")))
"""


@pytest.fixture
def fetched_job(orch: Orch, host: str) -> str:
    spec = write_job(orch.cwd, "trackers", host, ["python", "train.py"], extra="outputs: [runs/, wandb/]\n")
    (orch.cwd / "ws" / "train.py").write_text(SCRIPT)
    return json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]


def path_without_wandb(tmp_path: Path) -> str:
    """PATH for orch: the system's folders (ssh) and an empty one, none of them holding wandb."""
    bare = tmp_path / "bare-bin"
    bare.mkdir(exist_ok=True)
    path = os.pathsep.join([str(bare), "/usr/bin", "/bin"])
    assert shutil.which("wandb", path=path) is None, "this machine has wandb in /usr/bin or /bin"
    return path


def test_tracker_folders_are_fetched_and_wandb_sync_says_it_is_not_installed(orch: Orch, fetched_job: str,
                                                                               tmp_path: Path) -> None:
    out = orch("fetch", fetched_job, "--wandb-sync", env={"PATH": path_without_wandb(tmp_path)}, check=1)
    run = orch.cwd / "runs" / fetched_job
    offline = run / "wandb" / "offline-run-20261205_101010-abc123"
    assert (offline / "run-abc123.wandb").read_bytes() == b"W&B" * 100
    assert (offline / "files" / "config.yaml").read_text() == "lr: 0.1\n"
    events = EventAccumulator(str(run / "runs" / "exp1"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(0, 3.0), (1, 2.0), (2, 1.0)]
    assert "wandb/latest-run" in out.stderr  # the symlink is named, not followed
    shown = offline.relative_to(orch.cwd)  # as --dest (runs/ by default) names it, from where orch ran
    assert ("--wandb-sync: wandb is not installed on this laptop, so 1 offline run(s) stay unsynced; pip install wandb, "
            f"then: wandb sync {shown}") in out.stderr
    assert "Traceback" not in out.stderr


def test_wandb_sync_runs_the_laptops_wandb_on_the_offline_runs(orch: Orch, fetched_job: str, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "wandb").write_text(RECORDER.format(python=sys.executable))
    (bin_dir / "wandb").chmod(0o755)
    argv_file = tmp_path / "argv.jsonl"
    env = {"PATH": os.pathsep.join([str(bin_dir), path_without_wandb(tmp_path)]), "WANDB_ARGV_FILE": str(argv_file)}
    out = orch("fetch", fetched_job, "--wandb-sync", env=env)
    offline = Path("runs") / fetched_job / "wandb" / "offline-run-20261205_101010-abc123"  # relative to orch's cwd
    assert [json.loads(line) for line in argv_file.read_text().splitlines()] == [
        [str(bin_dir / "wandb"), "sync", str(offline)]]
    assert f"--wandb-sync: wandb sync {offline}" in out.stderr and "Syncing: fake" in out.stderr
    assert "Syncing" not in out.stdout
    failed = orch("fetch", fetched_job, "--wandb-sync", env={**env, "WANDB_EXIT": "3"}, check=1)
    assert "--wandb-sync: wandb sync exited 3" in failed.stderr
    assert orch("fetch", fetched_job, "--wandb-sync", "--watch", check=2).stderr.count("--wandb-sync goes without --watch") == 1

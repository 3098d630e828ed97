"""``{last_checkpoint}`` beyond Hugging Face's layout (remote_payload/supervisor/lastcheckpoint.py,
attempt.py): the newest complete checkpoint of each layout people's scripts write, on real
folder trees — accelerate's own ``save_state`` into ``step_N/``, ``torch.save`` files named as
Lightning names them, safetensors shards as torchtune writes them — and a torn or partial one
(cut, empty, a temporary name, a missing marker or shard) never chosen."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from remote_payload.supervisor import attempt, lastcheckpoint

# Writes the real files once: accelerate's save_state (as the no_trainer examples call it with
# --checkpointing_steps), Lightning-named torch.save files, torchtune-like safetensors shards.
MAKE = """\
import json, torch
from accelerate import Accelerator
from safetensors.torch import save_file

acc = Accelerator(cpu=True)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.StepLR(opt, 1)
model, opt, sched = acc.prepare(model, opt, sched)
for step in (2, 4):
    acc.save_state(f"acc/step_{step}")
state = {"state_dict": model.state_dict(), "global_step": 10, "epoch": 0}
for name in ("epoch=0-step=10.ckpt", "epoch=1-step=20.ckpt", "last.ckpt", "last-v1.ckpt"):
    torch.save(state, "lightning/" + name)
torch.save({"model": model.state_dict(), "iter_num": 250}, "nanogpt/ckpt.pt")
for i in (1, 2):
    save_file({"w%d" % i: torch.zeros(64)}, "tune/model-%05d-of-00002.safetensors" % i)
json.dump({"weight_map": {"w1": "model-00001-of-00002.safetensors", "w2": "model-00002-of-00002.safetensors"}},
          open("tune/model.safetensors.index.json", "w"))
"""


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("made")
    for d in ("lightning", "nanogpt", "tune"):
        (root / d).mkdir()
    (root / "make.py").write_text(MAKE)
    done = subprocess.run([sys.executable, "make.py"], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return root


def place(src: Path, dest: Path, mtime: float) -> Path:
    """``src`` (a file or folder) copied to ``dest``, every file's mtime set to ``mtime``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dest)
        for f in dest.iterdir():
            os.utime(f, (mtime, mtime))
    else:
        shutil.copyfile(src, dest)
        os.utime(dest, (mtime, mtime))
    return dest


def cut(path: Path, keep: int | None = None) -> None:
    """``path`` cut to ``keep`` bytes (default: half), as a write that died midway leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2 if keep is None else keep])


def found(job: Path) -> str | None:
    hit = lastcheckpoint.find(str(job))
    return None if hit is None else os.path.relpath(hit.path, job)


def test_accelerates_save_state_folders_the_highest_complete_step_wins(made: Path, tmp_path: Path) -> None:
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"} <= \
        {f.name for f in (made / "acc" / "step_4").iterdir()}  # what accelerate 1.x writes
    out = tmp_path / "job" / "code" / "out"
    place(made / "acc" / "step_2", out / "step_2", 1000)
    newest = place(made / "acc" / "step_4", out / "step_4", 2000)
    assert found(tmp_path / "job") == "code/out/step_4"
    place(made / "acc" / "step_2", out / "epoch_1", 3000)  # another series beside it: the newest written wins
    assert found(tmp_path / "job") == "code/out/epoch_1"
    (out / "epoch_1").rename(tmp_path / "aside")

    for tear in ("no random states", "random states cut", "weights cut", "optimizer empty", "a temporary file"):
        torn = out / "step_6"
        shutil.copytree(newest, torn)
        if tear == "no random states":  # killed before save_state reached its last file
            (torn / "random_states_0.pkl").unlink()
        elif tear == "random states cut":
            cut(torn / "random_states_0.pkl")
        elif tear == "weights cut":
            cut(torn / "model.safetensors", 40)
        elif tear == "optimizer empty":
            (torn / "optimizer.bin").write_bytes(b"")
        else:
            (torn / "model.safetensors.tmp").write_bytes(b"x")
        assert found(tmp_path / "job") == "code/out/step_4", tear
        shutil.rmtree(torn)


def test_lightning_ckpt_files_the_newest_last_then_the_highest_step(made: Path, tmp_path: Path) -> None:
    ckpts = tmp_path / "job" / "code" / "lightning_logs" / "version_0" / "checkpoints"  # Lightning's default place
    place(made / "lightning" / "epoch=0-step=10.ckpt", ckpts / "epoch=0-step=10.ckpt", 3000)
    place(made / "lightning" / "epoch=1-step=20.ckpt", ckpts / "epoch=1-step=20.ckpt", 1000)
    assert found(tmp_path / "job") == "code/lightning_logs/version_0/checkpoints/epoch=1-step=20.ckpt"
    cut(ckpts / "epoch=1-step=20.ckpt")  # a zip without its end record
    assert found(tmp_path / "job").endswith("/epoch=0-step=10.ckpt")

    place(made / "lightning" / "last.ckpt", ckpts / "last.ckpt", 2000)
    place(made / "lightning" / "last-v1.ckpt", ckpts / "last-v1.ckpt", 4000)  # a later run found last.ckpt taken
    (ckpts / "last-v2.ckpt").write_bytes(b"")  # created, never written
    assert found(tmp_path / "job").endswith("/last-v1.ckpt")
    cut(ckpts / "last-v1.ckpt", 100)
    assert found(tmp_path / "job").endswith("/checkpoints/last.ckpt")


def test_torchtune_epoch_folders_need_every_shard(made: Path, tmp_path: Path) -> None:
    out = tmp_path / "job" / "code" / "tune-out"
    place(made / "tune", out / "epoch_0", 1000)
    latest = place(made / "tune", out / "epoch_1", 2000)
    assert found(tmp_path / "job") == "code/tune-out/epoch_1"
    (latest / "model-00002-of-00002.safetensors").rename(tmp_path / "shard")
    assert found(tmp_path / "job") == "code/tune-out/epoch_0"
    (latest / "model.safetensors.index.json").unlink()  # the -of- names still say a shard is missing
    assert found(tmp_path / "job") == "code/tune-out/epoch_0"
    (out / "epoch_2").mkdir()  # a folder made, nothing written yet
    assert found(tmp_path / "job") == "code/tune-out/epoch_0"


def test_nanogpt_ckpt_pt_hf_checkpoints_and_the_newest_across_layouts(made: Path, tmp_path: Path) -> None:
    job = tmp_path / "job"
    place(made / "nanogpt" / "ckpt.pt", job / "code" / "out" / "ckpt.pt", 2000)
    assert found(job) == "code/out/ckpt.pt"
    hf = job / "code" / "hf"
    for n, when in ((4, 1000), (8, 3000)):
        (hf / f"checkpoint-{n}").mkdir(parents=True)
        place(made / "nanogpt" / "ckpt.pt", hf / f"checkpoint-{n}" / "rng_state.pth", when)
        (hf / f"checkpoint-{n}" / "trainer_state.json").write_text('{"global_step": %d}' % n)
        os.utime(hf / f"checkpoint-{n}" / "trainer_state.json", (when, when))
    assert found(job) == "code/hf/checkpoint-8"  # written after ckpt.pt
    (hf / "checkpoint-8" / "trainer_state.json").write_text('{"global_step": 8, "log_hi')  # cut mid-write
    os.utime(hf / "checkpoint-8" / "trainer_state.json", (3000, 3000))
    assert found(job) == "code/out/ckpt.pt"  # checkpoint-4 is complete but older than ckpt.pt
    (job / "code" / "out" / "ckpt.pt").write_bytes(b"")
    assert found(job) == "code/hf/checkpoint-4"
    assert lastcheckpoint.find(str(tmp_path / "nothing-here")) is None


def test_the_resume_plan_fills_last_checkpoint_or_says_the_script_starts_over(made: Path, tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / "code").mkdir(parents=True)
    none = attempt.plan(["--resume_from_checkpoint", "{last_checkpoint}"], str(job))
    assert none.args == [] and none.dropped is not None and none.note.startswith("the script starts over: ")
    assert "step_N/" in none.dropped and "*.ckpt" in none.dropped and "resume_args left out" in none.dropped
    place(made / "acc" / "step_4", job / "code" / "out" / "step_4", 1000)
    step = attempt.plan(["--resume_from_checkpoint", "{last_checkpoint}"], str(job))
    assert step.args == ["--resume_from_checkpoint", str(job / "code" / "out" / "step_4")] and step.dropped is None
    assert step.note.startswith("resuming from code/out/step_4 (the newest complete checkpoint, step_N/): ")
    plain = attempt.plan(["--init_from=resume"], str(job))
    assert plain.args == ["--init_from=resume"] and plain.dropped is None
    said: list[str] = []
    argv = attempt.resume_argv(["python", "t.py"], ["--ckpt={last_checkpoint}"], str(tmp_path / "empty"), said.append,
                               dropped=said.append)
    assert argv == ["python", "t.py"] and said[0].startswith("the script starts over") and said[1] == none.dropped

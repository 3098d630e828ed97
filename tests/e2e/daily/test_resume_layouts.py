"""`orch resume` beyond Hugging Face's layout (issue 39 item 3), through the CLI on `local` (the
accelerate case also on the loopback sshd): `{last_checkpoint}` finds accelerate's `save_state`
folders (`step_N/`, a torn one left by the kill skipped) and a Lightning-style `last.ckpt`; a
script whose `{last_checkpoint}` finds nothing starts over, and `orch resume`, `orch status` and
`--json` say so although it logged no step; `orch fetch` names the `last.ckpt` of the earlier
attempt beside the later `last-v1.ckpt`."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.orch import Orch

# accelerate's no_trainer examples' way: save_state into OUTPUT_DIR/step_N every few steps, and
# --resume_from_checkpoint PATH loaded with load_state, the step taken from the folder's name.
# Attempt 1 is killed at step 5, right after starting a step_6/ it never finishes.
ACCELERATE_STEPS = """\
import argparse, json, os, pathlib, sys
import torch
from accelerate import Accelerator

parser = argparse.ArgumentParser()
parser.add_argument("--output_dir")
parser.add_argument("--resume_from_checkpoint")
args = parser.parse_args()
acc = Accelerator(cpu=True)
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)
start = 0
if args.resume_from_checkpoint:
    acc.load_state(args.resume_from_checkpoint)
    start = int(os.path.basename(args.resume_from_checkpoint).replace("step_", ""))
attempt = os.environ["ORCH_ATTEMPT"]
pathlib.Path("outputs").mkdir(exist_ok=True)
pathlib.Path(f"outputs/attempt{attempt}.json").write_text(json.dumps({"argv": sys.argv[1:], "start": start}))
for step in range(start + 1, 9):
    loss = model(torch.ones(2, 4)).pow(2).mean()
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    print(f"step {step}/8 | loss {loss.item():.4f}", flush=True)
    if step % 2 == 0:
        acc.save_state(os.path.join(args.output_dir, f"step_{step}"))
    if step == 5 and attempt == "1":
        torn = pathlib.Path(args.output_dir, "step_6")
        torn.mkdir()
        (torn / "model.safetensors").write_bytes(bytes(10))
        os.kill(os.getpid(), 9)
"""

# Lightning's files, written with torch.save as Lightning does; attempt 2 ignores --ckpt_path
# (a script that builds its Trainer afresh): Lightning then finds last.ckpt taken and versions.
LIGHTNING_STYLE = """\
import json, os, pathlib, sys
import torch

attempt = int(os.environ["ORCH_ATTEMPT"])
ckpt = pathlib.Path("ckpt")
ckpt.mkdir(exist_ok=True)
pathlib.Path("outputs").mkdir(exist_ok=True)
pathlib.Path(f"outputs/attempt{attempt}.json").write_text(json.dumps(sys.argv[1:]))
if attempt == 1:
    torch.save({"global_step": 3}, ckpt / "epoch=0-step=3.ckpt")
    torch.save({"global_step": 3}, ckpt / "last.ckpt")
    sys.exit(3)
torch.save({"global_step": 6}, ckpt / "last-v1.ckpt")
"""

# Writes no checkpoint at all and logs no step.
NO_CHECKPOINT = """\
import json, os, pathlib, sys
pathlib.Path("outputs").mkdir(exist_ok=True)
pathlib.Path("outputs/attempt%s.json" % os.environ["ORCH_ATTEMPT"]).write_text(json.dumps(sys.argv[1:]))
sys.exit(3 if os.environ["ORCH_ATTEMPT"] == "1" else 0)
"""


def _spec(orch: Orch, name: str, script: str, text: str, command: str, resume_args: list[str],
          outputs: list[str], host: str = "local") -> Path:
    ws = orch.cwd / "ws"
    ws.mkdir(exist_ok=True)
    (ws / script).write_text(text)
    spec = orch.cwd / f"{name}.yaml"
    spec.write_text(json.dumps({"name": name, "hosts": [host], "workspace": {"path": "ws"},
                                "launch": {"command": command, "resume_args": resume_args}, "outputs": outputs}))
    return spec


def test_accelerates_step_folders_resume_from_the_newest_complete_one(orch: Orch, host: str) -> None:
    spec = _spec(orch, "acc", "train.py", ACCELERATE_STEPS,
                 "accelerate launch --num_processes 1 --cpu train.py --output_dir out",
                 ["--resume_from_checkpoint", "{last_checkpoint}"], ["out/", "outputs/", "logs/", "metrics.jsonl"],
                 host)
    first = json.loads(orch("submit", str(spec), "--follow", "--json", check=1, timeout=400).stdout)
    assert first["state"] == "failed" and "killed by signal 9" in first["reason"], first
    job = first["job_id"]
    code = orch.job_dir(job) / "code"
    assert sorted(p.name for p in (code / "out").iterdir()) == ["step_2", "step_4", "step_6"]
    resumed = orch("resume", job)
    assert "resuming from code/out/step_4 (the newest complete checkpoint, step_N/)" in resumed.stderr, resumed.stderr
    assert orch.wait_state(job, ("succeeded", "failed"), timeout=400)["state"] == "succeeded"
    second = json.loads((code / "outputs" / "attempt2.json").read_text())
    assert second == {"argv": ["--output_dir", "out", "--resume_from_checkpoint", str(code / "out" / "step_4")],
                      "start": 4}
    status = orch.json("status", job)
    assert "resume_dropped" not in status and status["progress"]["state"] == "succeeded"


def test_a_lightning_last_ckpt_is_found_a_restart_from_scratch_is_said_and_leftovers_are_named(orch: Orch) -> None:
    lit = _spec(orch, "lit", "lit.py", LIGHTNING_STYLE, "python lit.py", ["--ckpt_path={last_checkpoint}"],
                ["ckpt/", "outputs/", "logs/"])
    bare = _spec(orch, "bare", "bare.py", NO_CHECKPOINT, "python bare.py", ["--resume", "{last_checkpoint}"],
                 ["outputs/", "logs/"])
    jobs = {name: orch.json("submit", str(spec))["job_id"] for name, spec in (("lit", lit), ("bare", bare))}
    for job in jobs.values():
        assert orch.wait_state(job, ("succeeded", "failed"), timeout=300)["state"] == "failed"
    said = {name: orch("resume", job).stderr for name, job in jobs.items()}
    assert "resuming from code/ckpt/last.ckpt (the newest complete checkpoint, Lightning .ckpt)" in said["lit"]
    assert "the script starts over: no complete checkpoint for {last_checkpoint}" in said["bare"], said["bare"]
    for job in jobs.values():
        assert orch.wait_state(job, ("succeeded", "failed"), timeout=300)["state"] == "succeeded"

    lit_code = orch.job_dir(jobs["lit"]) / "code"
    assert json.loads((lit_code / "outputs" / "attempt2.json").read_text()) == [
        f"--ckpt_path={lit_code / 'ckpt' / 'last.ckpt'}"]
    assert "started over" not in orch("status", jobs["lit"]).stdout

    bare_code = orch.job_dir(jobs["bare"]) / "code"
    assert json.loads((bare_code / "outputs" / "attempt2.json").read_text()) == []  # resume_args left out
    status = orch.json("status", jobs["bare"])
    assert status["progress"]["state"] == "succeeded (started over)" and status["progress"]["step"] is None
    assert status["resume_dropped"] == status["progress"]["resume_dropped"]
    assert status["resume_dropped"].startswith("no complete checkpoint for {last_checkpoint} in the job folder")
    shown = orch("status", jobs["bare"]).stdout
    assert "succeeded (started over)" in shown and "note: started over: no complete checkpoint" in shown
    assert "(started over)" in orch("status").stdout

    fetched = orch("fetch", jobs["lit"])
    assert "ckpt/last.ckpt  (older than ckpt/last-v1.ckpt)" in fetched.stderr, fetched.stderr
    assert (orch.cwd / "runs" / jobs["lit"] / "ckpt" / "last-v1.ckpt").is_file()

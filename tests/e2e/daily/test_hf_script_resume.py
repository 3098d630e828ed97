"""A Hugging Face examples-style script (issue 22) from `orch check` to a resumed, plotted,
fetched result: HfArgumentParser dataclasses and `trainer.train(resume_from_checkpoint=...)` as
run_clm.py has them (which in transformers 5 no longer finds the last checkpoint itself),
launched with torchrun, told to resume by `launch.resume_args` with `{last_checkpoint}`.

The only line that is not run_clm's shape: a callback that stops attempt 1 at step 5, standing
in for a crash or a preempted box."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.orch import Orch
from tests.support.scripts import RUN_CLM_STYLE


def test_an_hf_examples_script_resumes_from_its_last_checkpoint(orch: Orch, tiny_assets: Path) -> None:
    ws = orch.cwd / "ws"
    (ws / "assets").mkdir(parents=True)
    for part in ("tiny-gpt2", "data"):
        src = tiny_assets / part
        for f in src.rglob("*"):
            if f.is_file():
                dest = ws / "assets" / part / f.relative_to(src)
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(f.read_bytes())
    (ws / "run_clm.py").write_text(RUN_CLM_STYLE)
    command = ("torchrun --nproc_per_node=2 run_clm.py --model_name_or_path assets/tiny-gpt2 "
               "--train_file assets/data/text.jsonl --output_dir out --max_steps 8 --save_steps 2 --logging_steps 1 "
               "--per_device_train_batch_size 2 --report_to none --use_cpu --save_total_limit 2")
    spec = orch.cwd / "clm.yaml"
    spec.write_text(json.dumps({
        "name": "clm", "hosts": ["local"], "workspace": {"path": "ws"}, "outputs": ["out/", "logs/", "metrics.jsonl"],
        "launch": {"command": command, "resume_args": ["--resume_from_checkpoint", "{last_checkpoint}"]}}))
    orch("check", str(spec))
    job = json.loads(orch("submit", str(spec), "--follow", "--json", check=1, timeout=600).stdout)
    assert job["state"] == "failed", job
    job_id = job["job_id"]
    orch("resume", job_id)
    final = orch.wait_state(job_id, ("succeeded", "failed"), timeout=600)
    assert final["state"] == "succeeded", final
    log = orch("logs", job_id).stdout
    out_dir = orch.job_dir(job_id) / "code" / "out"
    assert f"--resume_from_checkpoint {out_dir / 'checkpoint-4'}" in log  # the newest complete one
    state = json.loads((out_dir / "checkpoint-8" / "trainer_state.json").read_text())
    assert state["global_step"] == 8
    assert "(started over)" not in orch("status", job_id).stdout
    assert orch.json("status", job_id)["progress"]["started_over_at"] is None
    assert json.loads((out_dir.parent.parent / "status.json").read_text())["resumed_from_step"] >= 4
    orch("plot", job_id, "-o", str(orch.cwd / "clm.png"))
    assert (orch.cwd / "clm.png").stat().st_size > 0
    orch("fetch", job_id)
    assert (orch.cwd / "runs" / job_id / "out" / "model.safetensors").is_file()

"""Scripts in the manner of torchtune's recipes and accelerate's no_trainer examples (issue 39:
what the four upstream scripts print and save, run by hand through orch), through the CLI on
`local` and the loopback sshd: status STEP/LOSS, `orch plot`, and a torchtune-style resume
from its own `epoch_N/` with `resume_from_checkpoint=True`."""

from __future__ import annotations

import json

from tests.support.orch import Orch, write_job

# torchtune's lora_finetune_single_device: a tqdm bar per epoch whose description is
# `epoch|global step|Loss: x`, out/epoch_N/ and out/recipe_state/ at each epoch's end, and
# `resume_from_checkpoint=True` (a key=value override) to go on from the newest epoch.
TUNE = """\
import json, os, pathlib, sys, time
from tqdm import tqdm

overrides = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
out = pathlib.Path("out")
out.mkdir(exist_ok=True)
start = 0
if overrides.get("resume_from_checkpoint") == "True":
    start = json.loads((out / "recipe_state" / "recipe_state.json").read_text())["epochs_run"]
pathlib.Path("outputs").mkdir(exist_ok=True)
pathlib.Path("outputs/attempt%s.json" % os.environ["ORCH_ATTEMPT"]).write_text(json.dumps([sys.argv[1:], start]))
steps_per_epoch = 4
for epoch in range(start, 3):
    pbar = tqdm(total=steps_per_epoch)
    for i in range(steps_per_epoch):
        step = epoch * steps_per_epoch + i + 1
        time.sleep(0.02)
        pbar.update(1)
        pbar.set_description(f"{epoch + 1}|{step}|Loss: {12.0 - step / 4}")
    pbar.close()
    (out / f"epoch_{epoch}").mkdir(exist_ok=True)
    (out / f"epoch_{epoch}" / "adapter_config.json").write_text("{}")
    (out / "recipe_state").mkdir(exist_ok=True)
    (out / "recipe_state" / "recipe_state.json").write_text(json.dumps({"epochs_run": epoch + 1}))
    if epoch == 0 and os.environ["ORCH_ATTEMPT"] == "1":
        sys.exit(3)  # stopped once the first epoch was saved
"""

# accelerate's run_clm_no_trainer: a tqdm bar over all steps without a loss, and after each
# epoch `epoch N: perplexity: P eval_loss: L` through accelerate's logger (rank named).
NO_TRAINER = """\
import logging, math, time
from tqdm.auto import tqdm

logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                    datefmt="%m/%d/%Y %H:%M:%S", level=logging.INFO)
logger = logging.getLogger(__name__)
steps, epochs = 4, 3
bar = tqdm(range(steps * epochs))
for epoch in range(epochs):
    for _ in range(steps):
        time.sleep(0.15)  # past tqdm's mininterval: every step is drawn
        bar.update(1)
    eval_loss = 5.0 - epoch / 2
    logger.info(f"[RANK 0] epoch {epoch}: perplexity: {math.exp(eval_loss)} eval_loss: {eval_loss}")
"""


def _rows(orch: Orch, job: str) -> list[dict]:
    return [json.loads(line) for line in (orch.job_dir(job) / "metrics.jsonl").read_text().splitlines()]


def test_a_torchtune_style_recipe_gets_status_plot_and_resumes_from_its_epoch(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "tune", host, ["python", "recipe.py", "--config", "tiny.yaml", "device=cpu"],
                     extra="  resume_args: [resume_from_checkpoint=True]\noutputs: [out/, outputs/, logs/]\n")
    (orch.cwd / "ws" / "recipe.py").write_text(TUNE)
    first = json.loads(orch("submit", str(spec), "--follow", "--json", check=1, timeout=300).stdout)
    job = first["job_id"]
    assert first["state"] == "failed", first
    assert orch.json("status", job)["progress"]["step"] == 4
    said = orch("resume", job).stderr
    assert "resume_from_checkpoint=True appended to the command" in said, said
    assert orch.wait_state(job, ("succeeded", "failed"), timeout=300)["state"] == "succeeded"

    code = orch.job_dir(job) / "code"
    assert json.loads((code / "outputs" / "attempt2.json").read_text()) == [
        ["--config", "tiny.yaml", "device=cpu", "resume_from_checkpoint=True"], 1]
    rows = [r for r in _rows(orch, job) if "loss" in r]  # a bar's redraws: a row per BAR_ROW_S, its first and last
    assert all(r["loss"] == 12.0 - r["step"] / 4 for r in rows), rows
    for attempt, first, last in ((1, 1, 4), (2, 5, 12)):
        steps = [r["step"] for r in rows if r["attempt"] == attempt]
        assert steps[0] == first and steps[-1] == last and steps == sorted(set(steps)), rows
    status = orch.json("status", job)
    assert (status["progress"]["step"], status["progress"]["loss"]) == (12, 9.0)
    assert "started over" not in orch("status", job).stdout
    out = orch("plot", job, "-o", "tune.png")
    assert f"{len(rows)} loss, 0 eval_loss" in out.stderr and "2 attempts" in out.stderr, out.stderr


def test_an_accelerate_no_trainer_script_plots_its_eval_loss(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "clm", host, ["python", "clm.py"])
    (orch.cwd / "ws" / "clm.py").write_text(NO_TRAINER)
    done = json.loads(orch("submit", str(spec), "--follow", "--json", timeout=300).stdout)
    assert done["state"] == "succeeded", done
    job = done["job_id"]
    assert [(r["step"], r["eval_loss"]) for r in _rows(orch, job) if "eval_loss" in r] == [
        (4, 5.0), (8, 4.5), (12, 4.0)]
    assert orch.json("status", job)["progress"]["eval_loss"] == 4.0
    out = orch("plot", job, "-o", "clm.png")
    assert "0 loss, 3 eval_loss" in out.stderr, out.stderr
    assert (orch.cwd / "clm.png").stat().st_size > 0

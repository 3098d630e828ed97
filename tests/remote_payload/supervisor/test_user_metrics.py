"""Progress and metrics for user scripts (docs/own-script.md): the `remote_payload.report`
helper from a plain 2-process script, and a stock Hugging Face `Trainer` run picked up from its
log lines and trainer_state.json — `orch status --json` and `orch plot` through the real CLI.
Plus the line parser on real captured Trainer output (transformers 5.24, tqdm 4.70)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remote_payload import report
from remote_payload.supervisor import metricswatch, scrape
from tests.support.orch import Orch, write_job

HF_TRAIN = """\
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

assets, bar = sys.argv[1], "--no-bar" not in sys.argv
tok = AutoTokenizer.from_pretrained(assets + "/tiny-gpt2")
model = AutoModelForCausalLM.from_pretrained(assets + "/tiny-gpt2")
texts = [json.loads(line)["text"] for line in open(assets + "/data/text.jsonl")][:112]


class Texts(torch.utils.data.Dataset):
    def __init__(self, texts):
        self.rows = [tok(t, truncation=True, max_length=32, padding="max_length") for t in texts]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids = torch.tensor(self.rows[i]["input_ids"])
        return {"input_ids": ids, "attention_mask": torch.tensor(self.rows[i]["attention_mask"]), "labels": ids.clone()}


args = TrainingArguments(output_dir="out", max_steps=20, logging_steps=2, save_steps=10, report_to=[], use_cpu=True,
                         per_device_train_batch_size=4, eval_strategy="steps", eval_steps=10, disable_tqdm=not bar)
Trainer(model=model, args=args, train_dataset=Texts(texts[:96]), eval_dataset=Texts(texts[96:])).train()
"""

REPORTER = """\
import os
from remote_payload.report import metrics_path, report

rank = int(os.environ["RANK"])
assert metrics_path() == os.environ["ORCH_METRICS"] == os.path.join(os.environ["ORCH_JOB_DIR"], "metrics.jsonl")
for step in range(1, 6):
    wrote = report(step=step, loss=2.0 - step / 10, total_steps=50 if step == 1 else None, lr=1e-3,
                   tokens_per_s=1000.0 * step, grad_norm=float("nan"), note="not a number")
    assert wrote == (rank == 0), (rank, wrote)
    if step == 1 and rank == 0:
        print({"loss": 9.9, "learning_rate": 0.1}, flush=True)  # looks like HF: must not be added
report(step=5, eval_loss=1.5)
"""

HF_ENV = "env: {HF_HUB_OFFLINE: '1', TRANSFORMERS_OFFLINE: '1', OMP_NUM_THREADS: '1'}\n"
HF5_LOG = (
    '\rLoading weights:   0%|          | 0/28 [00:00<?, ?it/s]\rLoading weights: 100%|██████████| 28/28 [00:00<00:00, 19737.90it/s]\n'
    '\r  0%|          | 0/20 [00:00<?, ?it/s][transformers] `loss_type=None` was set in the config but it is unrecognized. Using the default loss: `ForCausalLMLoss`.\n'
    "\r                                      \r{'loss': '5.775', 'grad_norm': '4.782', 'learning_rate': '4.75e-05', 'epoch': '0.08333'}\n"
    "\r 10%|█         | 2/20 [00:00<00:00, 25.52it/s]\r                                              \r{'loss': '5.616', 'grad_norm': '6.628', 'learning_rate': '4.25e-05', 'epoch': '0.1667'}\n"
    "\r 20%|██        | 4/20 [00:00<00:00, 42.58it/s]\r 25%|██▌       | 5/20 [00:00<00:00, 49.50it/s]\r                                              \r{'loss': '5.559', 'grad_norm': '7.873', 'learning_rate': '3.75e-05', 'epoch': '0.25'}\n"
    "\r 30%|███       | 6/20 [00:00<00:00, 49.50it/s]\r                                              \r{'loss': '5.536', 'grad_norm': '6.063', 'learning_rate': '3.25e-05', 'epoch': '0.3333'}\n"
    "\r 40%|████      | 8/20 [00:00<00:00, 49.50it/s]\r                                              \r{'loss': '5.515', 'grad_norm': '6.468', 'learning_rate': '2.75e-05', 'epoch': '0.4167'}\n"
    '\r 50%|█████     | 10/20 [00:00<00:00, 49.50it/s]\n'
    '\r  0%|          | 0/4 [00:00<?, ?it/s]\x1b[A\r                                               \r\n'
    "\r                                     \r\x1b[A{'eval_loss': '5.543', 'eval_runtime': '0.0133', 'eval_samples_per_second': '2403', 'eval_steps_per_second': '300.3', 'epoch': '0.4167'}\n"
    '\r 50%|█████     | 10/20 [00:00<00:00, 49.50it/s]\n'
    '\r100%|██████████| 4/4 [00:00<00:00, 459.49it/s]\x1b[A\n'
    '\r                                              \x1b[A\n'
    '\rWriting model shards:   0%|          | 0/1 [00:00<?, ?it/s]\x1b[A\rWriting model shards: 100%|██████████| 1/1 [00:00<00:00, 185.17it/s]\n'
    "\r                                               \r{'loss': '5.695', 'grad_norm': '4.315', 'learning_rate': '2.25e-05', 'epoch': '0.5'}\n"
    "\r 60%|██████    | 12/20 [00:00<00:00, 49.50it/s]\r                                               \r{'loss': '5.564', 'grad_norm': '6.248', 'learning_rate': '1.75e-05', 'epoch': '0.5833'}\n"
    "\r 70%|███████   | 14/20 [00:00<00:00, 49.50it/s]\r 75%|███████▌  | 15/20 [00:00<00:00, 76.21it/s]\r                                               \r{'loss': '5.586', 'grad_norm': '5.055', 'learning_rate': '1.25e-05', 'epoch': '0.6667'}\n"
    "\r 80%|████████  | 16/20 [00:00<00:00, 76.21it/s]\r                                               \r{'loss': '5.598', 'grad_norm': '4.182', 'learning_rate': '7.5e-06', 'epoch': '0.75'}\n"
    "\r 90%|█████████ | 18/20 [00:00<00:00, 76.21it/s]\r                                               \r{'loss': '5.447', 'grad_norm': '5.571', 'learning_rate': '2.5e-06', 'epoch': '0.8333'}\n"
    '\r100%|██████████| 20/20 [00:00<00:00, 76.21it/s]\n'
    '\r  0%|          | 0/4 [00:00<?, ?it/s]\x1b[A\r                                               \r\n'
    "\r                                     \r\x1b[A{'eval_loss': '5.495', 'eval_runtime': '0.0118', 'eval_samples_per_second': '2706', 'eval_steps_per_second': '338.2', 'epoch': '0.8333'}\n"
    '\r100%|██████████| 20/20 [00:00<00:00, 76.21it/s]\n'
    '\r100%|██████████| 4/4 [00:00<00:00, 477.22it/s]\x1b[A\n'
    '\r                                              \x1b[A\n'
    '\rWriting model shards:   0%|          | 0/1 [00:00<?, ?it/s]\x1b[A\rWriting model shards: 100%|██████████| 1/1 [00:00<00:00, 425.86it/s]\n'
    "\r                                               \r{'train_runtime': '0.2699', 'train_samples_per_second': '296.4', 'train_steps_per_second': '74.11', 'train_loss': '5.589', 'epoch': '0.8333'}\n"
    '\r100%|██████████| 20/20 [00:00<00:00, 76.21it/s]\r100%|██████████| 20/20 [00:00<00:00, 73.96it/s]\n'
    '\n'
)


def rows_of(orch: Orch, job: str) -> list[dict]:
    text = (orch.job_dir(job) / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def hf_job(orch: Orch, host: str, assets: Path, name: str, *flags: str) -> str:
    spec = write_job(orch.cwd, name, host, ["python", "hf_train.py", str(assets), *flags], HF_ENV)
    (orch.cwd / "ws" / "hf_train.py").write_text(HF_TRAIN)
    done = orch("submit", str(spec), "--follow", "--json", timeout=600)
    result = json.loads(done.stdout)
    assert result["state"] == "succeeded", done.stderr[-3000:]
    return result["job_id"]


def plot_counts(orch: Orch, job: str) -> str:
    out = orch("plot", job, "-o", "curves.png")
    assert (orch.cwd / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return out.stderr


def test_a_stock_hf_trainer_gets_status_and_plot(orch: Orch, host: str, tiny_assets: Path) -> None:
    job = hf_job(orch, host, tiny_assets, "hf")
    progress = orch.json("status", job)["progress"]
    rows = rows_of(orch, job)
    train = [r for r in rows if "loss" in r]
    evals = [r for r in rows if "eval_loss" in r]
    assert [r["step"] for r in train] == list(range(2, 21, 2)) and [r["step"] for r in evals] == [10, 20]
    assert {r["source"] for r in rows} == {"hf-log"}  # trainer_state.json added nothing already there
    assert all(r["total_steps"] == 20 for r in rows) and all(r["lr"] > 0 for r in train)
    assert (progress["step"], progress["total"], progress["loss"]) == (20, 20, train[-1]["loss"])
    assert progress["eval_loss"] == evals[-1]["eval_loss"]
    assert "10 loss, 2 eval_loss, 10 lr, 0 tokens_per_s points" in plot_counts(orch, job)


def test_without_a_progress_bar_steps_come_from_trainer_state(orch: Orch, tiny_assets: Path) -> None:
    """disable_tqdm=True: the log lines carry no step (status shows their loss while the job
    runs); the checkpoint's trainer_state.json gives every row its step, and the total."""
    job = hf_job(orch, "local", tiny_assets, "hfnobar", "--no-bar")
    rows = rows_of(orch, job)
    from_state = [r for r in rows if r["source"] == "hf-state"]
    assert [r["step"] for r in from_state if "loss" in r] == list(range(2, 21, 2))
    assert [r["step"] for r in from_state if "eval_loss" in r] == [10, 20]
    assert all("step" not in r for r in rows if r["source"] == "hf-log")
    progress = orch.json("status", job)["progress"]
    assert (progress["step"], progress["total"]) == (20, 20) and progress["loss"] == from_state[-2]["loss"]
    assert "10 loss, 2 eval_loss, 10 lr" in plot_counts(orch, job)


def test_report_helper_from_a_plain_two_process_script(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "reporter", host, ["python", "reporter.py"])
    spec.write_text(spec.read_text().replace("nproc_per_node: 1", "nproc_per_node: 2"))
    (orch.cwd / "ws" / "reporter.py").write_text(REPORTER)
    done = orch("submit", str(spec), "--follow", "--json")
    job = json.loads(done.stdout)["job_id"]
    rows = rows_of(orch, job)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 5]  # rank 0 only, nothing read from the log
    assert all(r["total_steps"] == 50 and "source" not in r and "note" not in r for r in rows)
    assert rows[0]["grad_norm"] is None and rows[-1]["eval_loss"] == 1.5
    assert "metrics.jsonl is written by the job itself" in done.stderr
    progress = orch.json("status", job)["progress"]
    assert (progress["step"], progress["total"], progress["loss"], progress["eval_loss"]) == (5, 50, 1.5, 1.5)
    assert progress["tokens_per_s"] == 5000.0
    assert "5 loss, 1 eval_loss, 5 lr, 5 tokens_per_s points" in plot_counts(orch, job)


def test_report_never_raises_and_writes_only_on_rank_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("ORCH_METRICS", "ORCH_JOB_DIR", "RANK"):
        monkeypatch.delenv(var, raising=False)
    assert report.report(step=1, loss=1.0) is False  # outside orch: nowhere to write
    monkeypatch.setenv("ORCH_METRICS", str(tmp_path))  # a folder: the write fails
    assert report.report(step=1, loss=1.0) is False
    target = tmp_path / "m.jsonl"
    monkeypatch.setenv("ORCH_METRICS", str(target))
    monkeypatch.setenv("RANK", "1")
    assert report.report(step=1, loss=1.0) is False and not target.exists()
    monkeypatch.setenv("RANK", "0")
    assert report.report(step=2, loss=object(), lr=float("inf")) is False  # a loss that is no number
    assert report.report(step=3, loss=0.5, lr=float("inf"), total_steps=9) is True
    assert json.loads(target.read_text())["lr"] is None


def parse(text: str, chunk: int) -> list[dict]:
    parser = scrape.LineParser(clock=lambda: 123.0)
    rows = []
    for i in range(0, len(text), chunk):
        rows += parser.feed(text[i:i + chunk])
    return rows + parser.feed("\n") + parser.flush()


@pytest.mark.parametrize("chunk", [1, 7, 64, len(HF5_LOG)])
def test_parser_on_real_trainer_output(chunk: int) -> None:
    rows = parse(HF5_LOG, chunk)
    train = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train] == list(range(2, 21, 2))
    assert [r["step"] for r in rows if "eval_loss" in r] == [10, 20]  # the eval bar (0/4, 4/4) is no step
    assert train[0] == {"time": 123.0, "step": 2, "total_steps": 20, "loss": 5.775, "grad_norm": 4.782,
                        "lr": 4.75e-05, "epoch": 0.08333, "source": "hf-log"}
    assert not any("train_loss" in r for r in rows)  # the end-of-training summary is not a row


def test_parser_on_other_forms_and_junk() -> None:
    floats = "\r 10%|#   | 2/20 [00:01<00:09]\r    \r{'loss': 2.31, 'grad_norm': 1.5, 'learning_rate': 4.5e-05, 'epoch': 0.5}\n" \
             "\r 10%|#   | 2/20 [00:01<00:09]"  # transformers 4.x prints floats
    assert [(r["step"], r["loss"], r["lr"]) for r in parse(floats, 5)] == [(2, 2.31, 4.5e-05)]
    printer = "{'loss': '2.5', 'epoch': '0.1'}\n{'loss': '2.4', 'epoch': '0.2'}\n"  # disable_tqdm: no bar
    assert [("step" in r, r["loss"]) for r in parse(printer, 3)] == [(False, 2.5), (False, 2.4)]
    own = '{"step": 7, "loss": 1.25, "total": "x"}\n'
    assert [(r["step"], r["loss"], "total" in r) for r in parse(own, 100)] == [(7, 1.25, False)]
    junk = ("{'loss': __import__('os').system('echo hi')}\n{'loss': 'nan'}\n{'accuracy': 0.9}\n"
            "{'loss': 1.0" + " " * (scrape.MAX_SEGMENT + 10) + "}\n{'a': [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}\n")
    assert parse(junk, 1000) == []


def test_trainer_state_scan_and_rows(tmp_path: Path) -> None:
    for step in (10, 20):
        ckpt = tmp_path / "code" / "out" / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer_state.json").write_text(json.dumps({"max_steps": 40, "log_history": [
            {"step": s, "loss": 1.0 / s, "learning_rate": 0.1} for s in range(2, step + 1, 2)] + [
            {"step": step, "eval_loss": 0.5}, {"step": step, "train_loss": 0.7, "train_runtime": 3.0}]}))
    (tmp_path / "code" / "out" / "checkpoint-99").mkdir()  # no trainer_state.json: not a candidate
    path = scrape.find_trainer_state(str(tmp_path))
    assert path == str(tmp_path / "code" / "out" / "checkpoint-20" / "trainer_state.json")
    rows, total = scrape.state_rows(json.loads(Path(path).read_text()), 16, 10, 5.0)
    assert total == 40 and [(r["step"], "loss" in r) for r in rows] == [(18, True), (20, True), (20, False)]


def test_the_built_in_trainer_is_never_watched(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "train.json").write_text("{}")
    assert isinstance(metricswatch.watch(str(tmp_path), 0, print, {}), metricswatch._Off)
    (tmp_path / "train.json").unlink()
    assert isinstance(metricswatch.watch(str(tmp_path), 0, print, {"ORCH_METRICS_FROM_LOG": "0"}), metricswatch._Off)
    watcher = metricswatch.watch(str(tmp_path), 0, print, {})
    watcher.stop()
    assert isinstance(watcher, metricswatch.Watcher) and not (tmp_path / "metrics.jsonl").exists()


def test_the_same_step_read_again_from_another_rank_is_no_second_row(tmp_path: Path) -> None:
    """Two processes printing the same Hugging Face lines, however far apart: each step (and
    kind) once in metrics.jsonl; step-less rows and a new step go on."""
    watcher = metricswatch.Watcher(str(tmp_path), 0, lambda _: None)
    one = [{"step": 2, "loss": 5.8, "epoch": 0.3, "source": "hf-log"},
           {"step": 2, "eval_loss": 5.5, "epoch": 0.3, "source": "hf-log"}]
    watcher._write([dict(r) for r in one])
    watcher._write([dict(r) for r in one] + [{"epoch": 1.0, "loss": 1.0, "source": "log"},
                                             {"step": 4, "loss": 5.6, "epoch": 0.6, "source": "hf-log"}])
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r.get("step"), "loss" in r) for r in rows] == [(2, True), (2, False), (None, True), (4, True)]


def test_a_resumed_attempt_never_rewrites_the_history_its_checkpoint_carries(tmp_path: Path) -> None:
    """TRL resumed from checkpoint-150 (found by hand, issue 39): Trainer copies the checkpoint's
    log_history into every trainer_state.json it writes next. The state there before the attempt
    began is an earlier attempt's: only steps past it are this attempt's rows."""
    def checkpoint(step: int) -> None:
        ckpt = tmp_path / "code" / "out" / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 400, "log_history": [
            {"step": s, "loss": 1.0 / s} for s in range(50, step + 1, 50)]}))

    checkpoint(150)
    watcher = metricswatch.Watcher(str(tmp_path), 0, lambda _: None, attempt=2)
    watcher._scan_state()
    assert not (tmp_path / "metrics.jsonl").exists()  # the earlier attempt's own state: nothing new
    checkpoint(250)
    watcher._scan_state()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["attempt"]) for r in rows] == [(200, 2), (250, 2)]

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    first = metricswatch.Watcher(str(fresh), 0, lambda _: None, attempt=1)
    (tmp_path / "code").rename(fresh / "code")  # written during the attempt: all of it is its own
    first._scan_state()
    assert [json.loads(line)["step"] for line in (fresh / "metrics.jsonl").read_text().splitlines()] == [50, 100, 150,
                                                                                                           200, 250]

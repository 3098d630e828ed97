"""Progress from what a user's own script prints (remote_payload/supervisor/scrape.py): the
common formats, each in the shape the real tool prints it (nanoGPT's train.py, tqdm's bar and
postfix, Lightning's TQDMProgressBar, accelerate-style dict prints, transformers'
``Trainer.log_metrics`` table), lines that must not become rows, ``launch.progress``, the
rate limit, and the watcher's ``attempt`` key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remote_payload import report
from remote_payload.contract.userpattern import PatternWorker
from remote_payload.supervisor import metricswatch, scrape


def parse(text: str, chunk: int = 1 << 20, progress: str | None = None, clock: float = 123.0) -> list[dict]:
    worker = PatternWorker(progress) if progress else None  # launch.progress runs in its worker, as on the server
    parser = scrape.LineParser(clock=lambda: clock, progress=worker)
    rows = []
    for i in range(0, len(text), chunk):
        rows += parser.feed(text[i:i + chunk])
    rows += parser.feed("\n") + parser.flush()
    if worker is not None:
        assert worker.off is None, worker.off
        worker.close()
    return rows


def picked(rows: list[dict], *keys: str) -> list[tuple]:
    return [tuple(r.get(k) for k in keys) for r in rows]


# nanoGPT's train.py: the eval line at every eval_interval (before that iteration's step),
# then one line per log_interval; mfu is -100.00% until the fifth iteration.
NANOGPT = "".join(
    (f"step {i}: train loss {4.0 - i / 100:.4f}, val loss {4.1 - i / 100:.4f}\n" if i % 50 == 0 else "")
    + f"iter {i}: loss {4.0 - i / 100:.4f}, time {31.25 + i / 7:.2f}ms, mfu {-100.0 if i < 5 else 1.5:.2f}%\n"
    for i in range(0, 101, 10)
)


@pytest.mark.parametrize("chunk", [1, 13, 1 << 20])
def test_nanogpt_iter_and_eval_lines(chunk: int) -> None:
    rows = parse("Initializing a new model from scratch\nnumber of parameters: 10.65M\n" + NANOGPT, chunk)
    train = [r for r in rows if "eval_loss" not in r]
    assert picked(train, "step", "loss") == [(i, round(4.0 - i / 100, 4)) for i in range(0, 101, 10)]
    assert picked([r for r in rows if "eval_loss" in r], "step", "loss", "eval_loss") == [
        (0, 4.0, 4.1), (50, 3.5, 3.6), (100, 3.0, 3.1)]
    assert rows[1] == {"time": 123.0, "step": 0, "loss": 4.0, "source": "log"}  # time and mfu are not kept
    assert all(r["source"] == "log" and "total_steps" not in r for r in rows)  # nanoGPT never prints its total


@pytest.mark.parametrize("line, expected", [
    ("epoch 1 step 200 loss 0.5", {"step": 200, "epoch": 1.0, "loss": 0.5}),
    ("Step 20/100 | loss 2.31", {"step": 20, "total_steps": 100, "loss": 2.31}),
    ("Epoch [1/5], Step [100/600], Loss: 0.2188", {"step": 100, "total_steps": 600, "epoch": 1.0, "loss": 0.2188}),
    ("step    5 | loss: 10.947519 | lr 6.0000e-05 | norm: 15.3943 | dt: 1234.56ms | tok/sec: 424685.69",
     {"step": 5, "loss": 10.947519, "lr": 6e-05, "tokens_per_s": 424685.69}),
    ("step    1/74: train loss 4.367631 (acc 4.367631) (110.766838 ms, 4621 tok/s)",
     {"step": 1, "total_steps": 74, "loss": 4.367631, "tokens_per_s": 4621.0}),
    ("step 3/10 | epoch 1 | loss 2.5000 | lr 1.00e-03 | grad norm 1.000 | 12,345 tok/s | 10 MiB",
     {"step": 3, "total_steps": 10, "epoch": 1.0, "loss": 2.5, "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 12345.0}),
    (" iteration      100/  500000 | consumed samples:         1600 | elapsed time per iteration (ms): 812.3 | "
     "learning rate: 1.500E-04 | global batch size:    16 | lm loss: 7.123456E+00 | loss scale: 65536.0 | "
     "grad norm: 2.345 |", {"step": 100, "total_steps": 500000, "loss": 7.123456, "lr": 1.5e-4, "grad_norm": 2.345}),
    ("[rank0]:2024-05-01 12:00:00,123 - INFO - global_step=40, train_loss=1.25, val_loss=1.5",
     {"step": 40, "loss": 1.25, "eval_loss": 1.5}),
    ("Epoch 3: loss 0.52", {"epoch": 3.0, "loss": 0.52}),  # no step printed: none is made up
])
def test_key_value_progress_lines(line: str, expected: dict) -> None:
    assert parse(line + "\n") == [{"time": 123.0, "source": "log", **expected}]


@pytest.mark.parametrize("line", [
    "loss of connection",
    "learning_rate: 0.1",
    "  loss: 0.5",  # a config dump: a loss, but no step or epoch
    "max_steps: 1000",
    "warmup_steps 100 loss_weight 0.5",
    "starting: python train.py --step 5 --loss 0.1",
    "[orch] starting: python train.py step=5 loss=0.1",  # the supervisor's own line
    "step 5: loss nan (skipping batch)",
    "Saving checkpoint at step 500 (loss scale 1024)",
    "Namespace(eval_iters=200, log_interval=10, loss='ce', max_iters=5000)",
    "Config: {'loss': 0.5, 'lr': 0.1}",
    "epoch 1: {'accuracy': 0.84, 'f1': 0.88}",  # accelerate's nlp_example: no loss
    "step 5 loss 0.5" + " " * scrape.MAX_TEXT,  # too long for a progress line
    "Loading checkpoint shards: 100%|██████████| 2/2 [00:01<00:00,  1.50it/s]",
    "Validation DataLoader 0: 100%|██████████| 4/4 [00:00<00:00, 50.00it/s]",
    ("***** train metrics *****\n  epoch                    =        3.0\n  train_loss               =     2.5123\n"
     "  train_runtime            = 0:00:12.34\n"),  # the end-of-training summary is no row
])
def test_lines_that_are_no_rows(line: str) -> None:
    assert parse(line + "\n") == []


def test_tqdm_postfix_bar_redraws() -> None:
    """tqdm's own redraws (``set_postfix(loss=..., lr=...)``; numbers as tqdm formats them),
    separated by \\r and sometimes a trailing space: one row per step, total from the bar."""
    log = ("\r  0%|          | 0/200 [00:00<?, ?it/s]"
           "\r  6%|5         | 11/200 [00:03<00:51, 3.68it/s, loss=2.31, lr=1e-5] "
           "\r  6%|6         | 12/200 [00:03<00:50, 3.71it/s, loss=2.31, lr=1e-5]"
           "\r  6%|6         | 12/200 [00:03<00:50, 3.71it/s, loss=2.29, lr=1e-5]\n")
    rows = parse(log)
    assert picked(rows, "step", "total_steps", "loss", "lr") == [(11, 200, 2.31, 1e-5)] + [(12, 200, 2.31, 1e-5)]
    described = "\rtrain:  50%|█████     | 100/200 [00:30<00:30,  3.33it/s, loss: 1.234]\n"  # set_postfix_str
    assert picked(parse(described), "step", "total_steps", "loss") == [(100, 200, 1.234)]


def test_a_redrawn_bar_gives_a_row_every_bar_row_s() -> None:
    now = [100.0]
    parser = scrape.LineParser(clock=lambda: now[0])
    rows = []
    for n in range(1, 41):  # a redraw every 0.25 s
        rows += parser.feed(f"\r  {n}%|          | {n}/40 [00:{n:02d}<00:10, 4.00it/s, loss={3 - n / 20:.3f}]")
        rows += parser.flush(older_than=scrape.PENDING_MAX_S)
        now[0] += 0.25
    rows += parser.feed("\n") + parser.flush()
    steps = [r["step"] for r in rows]
    assert steps[0] == 1 and steps[-1] == 40 and len(steps) == 40 * 0.25 / scrape.BAR_ROW_S + 1
    assert steps == sorted(steps)


def test_lightning_progress_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's TQDMProgressBar: the training bar ``Epoch E`` over the epoch's batches, the
    postfix ``v_num`` and the prog_bar metrics padded to five characters; after each validation
    the postfix also holds val_loss. The validation bar itself is no row."""
    monkeypatch.setattr(scrape, "BAR_ROW_S", 0.0)  # every redraw's step, for this test
    epoch = ("\rEpoch {e}:   0%|          | 0/32 [00:00<?, ?it/s] "
             "\rEpoch {e}:  50%|█████     | 16/32 [00:01<00:01, 12.34it/s, v_num=0, train_loss=0.512{val}]"
             "\rEpoch {e}: 100%|██████████| 32/32 [00:02<00:00, 12.34it/s, v_num=0, train_loss=0.498{val}]"
             "\n\rValidation: |          | 0/? [00:00<?, ?it/s]\x1b[A"
             "\rValidation DataLoader 0: 100%|██████████| 4/4 [00:00<00:00, 50.00it/s]\x1b[A"
             "\rEpoch {e}: 100%|██████████| 32/32 [00:02<00:00, 12.34it/s, v_num=0, train_loss=0.498, val_loss={v}]")
    log = "".join(epoch.format(e=e, v=f"{0.6 - e / 10:.3f}", val=f", val_loss={0.7 - e / 10:.3f}" if e else "")
                  for e in range(3)) + "\n"
    rows = parse(log, 17)
    train = [r for r in rows if "loss" in r]
    assert picked(train, "step", "epoch", "loss") == [(16, 0, 0.512), (32, 0, 0.498), (48, 1, 0.512), (64, 1, 0.498),
                                                      (80, 2, 0.512), (96, 2, 0.498)]
    assert picked([r for r in rows if "eval_loss" in r], "step", "eval_loss") == [(32, 0.6), (64, 0.5), (96, 0.4)]
    assert not any("total_steps" in r or "v_num" in r for r in rows)
    assert not any("eval_loss" in r for r in train)
    infinite = "\rEpoch 0: 12it [00:01,  9.50it/s, v_num=3, train_loss_step=0.512, train_loss_epoch=0.600]\n"
    assert picked(parse(infinite), "step", "loss") == [(12, 0.512)]  # an iterable dataset: no total


def test_printed_dicts() -> None:
    """``accelerator.print({...})`` (Python repr) and ``print(f"epoch {epoch}: {metrics}")``."""
    log = ("{'epoch': 0, 'step': 100, 'train_loss': 0.8125, 'lr': 5e-05}\n"
           "epoch 0: {'eval_loss': 0.7, 'accuracy': 0.61}\n"
           "epoch 1 step 300: {\"loss\": 0.5, \"val_loss\": 0.6}\n")
    rows = parse(log)
    assert picked(rows, "step", "epoch", "loss", "eval_loss", "lr", "accuracy") == [
        (100, 0, 0.8125, None, 5e-05, None), (100, 0, None, 0.7, None, 0.61), (300, 1, 0.5, 0.6, None, None)]
    assert [r["source"] for r in rows] == ["hf-log", "log", "log"]


def test_hf_log_metrics_eval_table_at_the_last_step() -> None:
    """run_clm.py and friends end with ``trainer.log_metrics("train"/"eval", metrics)``: the
    eval table is a row at the step the training bar last showed."""
    log = ("\r100%|██████████| 20/20 [00:05<00:00,  3.90it/s]\r100%|██████████| 20/20 [00:05<00:00,  3.61it/s]\n"
           "***** train metrics *****\n"
           "  epoch                    =        3.0\n"
           "  total_flos               =      123GF\n"
           "  train_loss               =     2.5123\n"
           "  train_runtime            = 0:00:05.54\n"
           "  train_samples_per_second =     43.273\n"
           "***** eval metrics *****\n"
           "  epoch                   =     3.0\n"
           "  eval_accuracy           =  0.4321\n"
           "  eval_loss               =  2.1234\n"
           "  eval_runtime            = 0:00:00.41\n"
           "  eval_samples            =      24\n"
           "  perplexity              =    8.36\n")
    for text in (log, log + "[INFO|modelcard.py:450] 2024-05-01 >> Dropping the following result\n"):
        assert parse(text, 50) == [{"time": 123.0, "step": 20, "epoch": 3.0, "eval_accuracy": 0.4321, "eval_loss": 2.1234,
                                    "eval_samples": 24.0, "perplexity": 8.36, "source": "log"}]
    assert parse(log.split("\n", 1)[1]) == [{"time": 123.0, "epoch": 3.0, "eval_accuracy": 0.4321, "eval_loss": 2.1234,
                                             "eval_samples": 24.0, "perplexity": 8.36, "source": "log"}]  # no bar: no step


def test_hf_trainer_lines_keep_their_source_and_steps() -> None:
    log = ("\r 10%|█         | 2/20 [00:00<00:00, 25.52it/s]\r                 \r"
           "{'loss': '5.616', 'grad_norm': '6.628', 'learning_rate': '4.25e-05', 'epoch': '0.1667'}\n"
           "\r 20%|██        | 4/20 [00:00<00:00, 42.58it/s]\n")
    assert picked(parse(log), "step", "total_steps", "loss", "source") == [(4, 20, 5.616, "hf-log")]


def test_launch_progress_regex() -> None:
    pattern = r"it=(?P<step>[\d,]+)/(?P<total_steps>\d+) L=(?P<loss>\S+) lr=(?P<lr>\S+)(?: ev=(?P<eval_loss>\S+))?"
    log = ("it=1,000/5000 L=2.5 lr=3e-4\n"
           "it=1,010/5000 L=2.4 lr=3e-4 ev=2.6\n"
           "it=1.5/5000 L=oops lr=x\n"  # matches, but no number for step or loss: no row
           "iter 1020: loss 2.3000, time 10.00ms, mfu 1.00%\n")  # the built-in formats still apply
    rows = parse(log, progress=pattern)
    assert picked(rows, "step", "total_steps", "loss", "lr", "eval_loss", "source") == [
        (1000, 5000, 2.5, 3e-4, None, "progress"), (1010, 5000, 2.4, 3e-4, 2.6, "progress"),
        (1020, None, 2.3, None, None, "log")]
    only_loss = parse("epoch 2 avg 0.25\n", progress=r"avg (?P<loss>[\d.]+)")
    assert picked(only_loss, "step", "loss", "source") == [(None, 0.25, "progress")]
    # a line over MAX_SEGMENT is never given to the pattern (nor to anything else)
    assert parse("9" * (scrape.MAX_SEGMENT + 10) + "\n", 4096, progress=r"(?P<step>\d+)") == []


def test_printed_lines_are_rate_limited() -> None:
    """A script printing thousands of lines a second gets LINE_BURST rows at once, then
    LINE_RATE a second; the newest line held back is written when due, eval rows always."""
    now = [50.0]
    parser = scrape.LineParser(clock=lambda: now[0])
    rows = parser.feed("".join(f"iter {i}: loss 1.0, time 1.00ms, mfu 1.00%\n" for i in range(500)))
    assert len(rows) == scrape.LINE_BURST and rows[-1]["step"] == scrape.LINE_BURST - 1
    rows = parser.feed("step 500: train loss 1.0, val loss 2.0\n")  # has a loss: thinned like the rest
    assert rows == [] and parser.flush(older_than=scrape.PENDING_MAX_S) == []
    assert parser.feed("epoch 3 val_loss 2.0\n")[0]["eval_loss"] == 2.0  # an eval row goes at once
    now[0] += 1.0
    held = parser.flush(older_than=scrape.PENDING_MAX_S)
    assert [r["step"] for r in held] == [500]
    now[0] += 1.0
    rows = parser.feed("".join(f"iter {i}: loss 1.0, time 1.00ms, mfu 1.00%\n" for i in range(501, 600)))
    assert len(rows) == 2 * scrape.LINE_RATE - 1  # two seconds' worth, less the held row's
    assert [r["step"] for r in parser.flush()] == [599]


def test_a_line_every_rank_prints_is_one_row() -> None:
    """A DDP script printing on every rank: each step's line comes once per process, close
    together; the same step and epoch printed again later (a per-epoch counter) is a row."""
    now = [10.0]
    parser = scrape.LineParser(clock=lambda: now[0])
    rows = []
    for epoch in (1, 2):
        for step in (100, 200):
            for rank in range(4):
                rows += parser.feed(f"epoch {epoch} step {step} loss {rank / 10 + step / 1000:.3f}\n")
            now[0] += 0.5
    rows += parser.feed("step 300: train loss 1.0, val loss 2.0\nstep 300 loss 1.0\n")  # eval and train: both
    assert picked(rows, "epoch", "step", "loss", "eval_loss") == [(1, 100, 0.1, None), (1, 200, 0.2, None),
                                                                  (2, 100, 0.1, None), (2, 200, 0.2, None),
                                                                  (None, 300, 1.0, 2.0), (None, 300, 1.0, None)]
    now[0] += scrape.SAME_S + 1
    assert picked(parser.feed("epoch 1 step 100 loss 0.1\n"), "step") == [(100,)]  # long after: a row again
    for i in range(scrape.MAX_RECENT + 10):  # what is remembered stays bounded
        parser.feed(f"step {1000 + i} loss 1.0\n")
    assert len(parser.recent) <= scrape.MAX_RECENT


def job_dir(tmp_path: Path, progress: str | None = None) -> Path:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "node0.log").write_text("an earlier attempt's line: iter 99: loss 9.0\n")
    (tmp_path / "job.json").write_text(json.dumps({"job_id": "j", "progress": progress}))
    return tmp_path


def metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def test_watcher_marks_every_row_with_its_attempt(tmp_path: Path) -> None:
    d = job_dir(tmp_path, progress=r"^E(?P<step>\d+) (?P<loss>[\d.]+)$")
    said: list[str] = []
    watcher = metricswatch.watch(str(d), 0, said.append, {"ORCH_ATTEMPT": "2"})
    with open(d / "logs" / "node0.log", "a") as log:
        log.write("iter 10: loss 2.5000, time 1.00ms, mfu 1.00%\nE11 2.4\n")
    watcher.stop()
    rows = metrics(d)
    assert picked(rows, "step", "loss", "attempt", "source") == [(10, 2.5, 2, "log"), (11, 2.4, 2, "progress")]
    # the next attempt continues the file (its last row is the watcher's); without ORCH_ATTEMPT no key
    watcher = metricswatch.watch(str(d), 0, said.append, {})
    with open(d / "logs" / "node0.log", "a") as log:
        log.write("iter 5: loss 2.9000, time 1.00ms, mfu 1.00%\n")
    watcher.stop()
    assert picked(metrics(d)[2:], "step", "attempt") == [(5, None)] and said == []


def test_watcher_with_a_pattern_this_python_cannot_read(tmp_path: Path) -> None:
    assert [metricswatch.attempt_of({"ORCH_ATTEMPT": v}) for v in ("1", " 12 ", "", "x", "²", "-1")] == [
        1, 12, None, None, None, None]
    d = job_dir(tmp_path, progress="(?P<step")
    said: list[str] = []
    watcher = metricswatch.watch(str(d), 0, said.append, {"ORCH_ATTEMPT": "1"})
    assert isinstance(watcher, metricswatch.Watcher)
    with open(d / "logs" / "node0.log", "a") as log:
        log.write("Step 20/100 | loss 2.31\n")
    watcher.stop()
    assert picked(metrics(d), "step", "total_steps", "attempt") == [(20, 100, 1)]
    assert len(said) == 1 and "launch.progress is not a regular expression" in said[0]


def test_watcher_yields_to_rows_the_script_writes(tmp_path: Path) -> None:
    d = job_dir(tmp_path)
    said: list[str] = []
    watcher = metricswatch.Watcher(str(d), 0, said.append)  # run by hand: one poll, then the end
    with open(d / "logs" / "node0.log", "a") as log:
        log.write("iter 1: loss 2.5000, time 1.00ms, mfu 1.00%\n")
    watcher._read_log(1 << 20)
    with open(d / "metrics.jsonl", "a") as own:
        own.write(json.dumps({"step": 1, "loss": 2.5}) + "\n")
    with open(d / "logs" / "node0.log", "a") as log:
        log.write("iter 2: loss 2.4000, time 1.00ms, mfu 1.00%\n")
    watcher.drain()  # the last pass, as stop() runs it on the duty's thread
    assert picked(metrics(d), "step", "source") == [(1, "log"), (1, None)]
    assert any("written by the job itself" in s for s in said)
    assert isinstance(metricswatch.watch(str(d), 0, print, {"ORCH_METRICS_FROM_LOG": "0"}), metricswatch._Off)


def test_report_adds_the_attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "m.jsonl"
    monkeypatch.setenv("ORCH_METRICS", str(target))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("ORCH_ATTEMPT", "3")
    assert report.report(step=1, loss=1.0, attempt=9)  # the environment's attempt wins
    monkeypatch.setenv("ORCH_ATTEMPT", "²")  # not an attempt number: no key, the row all the same
    assert report.report(step=2, loss=1.0)
    monkeypatch.delenv("ORCH_ATTEMPT")
    assert report.report(step=3, loss=1.0)
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    assert [r.get("attempt") for r in rows] == [3, None, None]


def test_a_catastrophic_pattern_is_switched_off_once_and_the_built_in_formats_go_on(tmp_path: Path) -> None:
    """``(x+x+)+y`` and a line of 40 x: the line blows the worker's budget, the pattern is off
    for the job (said once in the log, handed once to ``note`` for status), the watcher ends,
    and the lines after it are still read by the built-in formats."""
    d = job_dir(tmp_path, progress=r"(?P<step>(x+x+)+)y (?P<loss>[\d.]+)")
    said: list[str] = []
    notes: list[str] = []
    watcher = metricswatch.watch(str(d), 0, said.append, {}, notes.append)
    assert isinstance(watcher, metricswatch.Watcher) and watcher.helper_pids()  # the worker: never the job's
    with open(d / "logs" / "node0.log", "a") as log:
        log.write("xxy 2.5\n" + "x" * 40 + "\n" + "x" * 40 + "\nxxxy 2.0\niter 7: loss 1.5000, time 1.00ms\n")
    watcher.stop()
    assert picked(metrics(d), "step", "loss", "source") == [(None, 2.5, "progress"), (7, 1.5, "log")]
    assert len(said) == 1 and said == notes
    assert said[0].startswith("launch.progress is switched off for this job: it took more than 1 s of CPU on a "
                              "line of 40 characters; only the built-in formats are read from now on")
    assert watcher.helper_pids() == set()


# Lightning 2.6's RichProgressBar (rich 15) as the supervisor's TTY_COMPATIBLE=1 TTY_INTERACTIVE=1
# make it write to the node log: a redraw per batch after ``\r`` and erase escapes, its metrics
# wrapped onto a second line at 80 columns (captured from a 2-epoch, 3-batch run with validation).
RICH_LIGHTNING = (
    '\r'
    '\x1b[2KEpoch 0/1                                       0/3 \x1b[2m0:00:00 • -:--:--\x1b[0m \x1b[2;4m0.00it/s\x1b[0m \r'
    '\x1b[2KEpoch 0/1  ━━━━━━╸              1/3 \x1b[2m0:00:00 • -:--:--\x1b[0m \x1b[2;4m0.00it/s\x1b[0m \x1b[3mtrain_loss: 2.924\x1b[0m\r'
    '\x1b[2KEpoch 0/1  ━━━━━━━━━━━━━━━━━━ 3/3 \x1b[2m0:00:00 • 0:00:00\x1b[0m \x1b[2;4m522.19it/s\x1b[0m \x1b[3mtrain_loss: 0.485\x1b[0m\r'
    '\x1b[2KEpoch 0/1  ━━━━━━━━━━━━━━━━━ 3/3 \x1b[2m0:00:00 • 0:00:00\x1b[0m \x1b[2;4m522.19it/s \x1b[0m \x1b[3mtrain_loss: 0.485\x1b[0m\n'
    'Validation ━━━━━━━━━━━       2/3 \x1b[2m0:00:00 • 0:00:01\x1b[0m \x1b[2;4m1591.01it/s\x1b[0m                  \r'
    '\x1b[2K\x1b[1A\x1b[2KEpoch 1/1                     0/3 \x1b[2m0:00:00 • 0:00:00\x1b[0m \x1b[2;4m0.00it/s\x1b[0m \x1b[3mtrain_loss: 0.485  \x1b[0m\n'
    '                                                             \x1b[3mval_loss: 1.041    \x1b[0m\r'
    '\x1b[2K\x1b[1A\x1b[2KEpoch 1/1  ━━━━━━             1/3 \x1b[2m0:00:00 • -:--:--\x1b[0m \x1b[2;4m0.00it/s\x1b[0m \x1b[3mtrain_loss: 2.151  \x1b[0m\n'
    '                                                             \x1b[3mval_loss: 1.041    \x1b[0m\r'
    '\x1b[2K\x1b[1A\x1b[2KEpoch 1/1  ━━━━━━━━━━━━━━━━━ 3/3 \x1b[2m0:00:00 • 0:00:00\x1b[0m \x1b[2;4m124.71it/s\x1b[0m \x1b[3mtrain_loss: 0.488 \x1b[0m\n'
    '                                                              \x1b[3mval_loss: 1.041   \x1b[0m`Trainer.fit` stopped: `max_epochs=2` reached.\n'
    '\r'
    '\x1b[2K\x1b[1A\x1b[2KEpoch 1/1  ━━━━━━━━━━━━━━━━━ 3/3 \x1b[2m0:00:00 • 0:00:00\x1b[0m \x1b[2;4m124.71it/s\x1b[0m \x1b[3mtrain_loss: 0.488 \x1b[0m\n'
    '                                                              \x1b[3mval_loss: 0.924   \x1b[0m\n'
    '\x1b[?25h'
)


def by_redraw(text: str) -> list[dict]:
    """Rows from ``text`` fed a redraw at a time, BAR_ROW_S apart (a bar is thinned to a row per that)."""
    now = [0.0]
    parser = scrape.LineParser(clock=lambda: now[0])
    rows = []
    for piece in text.split("\r"):
        rows += parser.feed(piece + "\r")
        now[0] += scrape.BAR_ROW_S
    return rows + parser.feed("\n") + parser.flush()


def test_lightning_rich_bar() -> None:
    rows = by_redraw(RICH_LIGHTNING)
    assert picked([r for r in rows if "loss" in r], "step", "loss") == [(1, 2.924), (3, 0.485), (4, 2.151),
                                                                         (6, 0.488)]
    assert picked([r for r in rows if "eval_loss" in r], "step", "eval_loss") == [(3, 1.041), (6, 0.924)]
    assert not any("total_steps" in r for r in rows)
    # without those variables a file gets only the last redraw, once the bar stops
    end = "Epoch 1/1  " + "\u2501" * 17 + " 3/3 0:00:00 \u2022 0:00:00 124.12it/s train_loss: 0.488 \n" + " " * 62 + "val_loss: 0.924   \n"
    assert picked(parse(end), "step", "loss", "eval_loss") == [(6, 0.488, None), (6, None, 0.924)]


# Lightning's examples/pytorch/basics/transformer.py with devices=2 through orch (issue 39, by
# hand): the bar is wide, so Rich wraps its metrics one a line, val_loss on the third line.
RICH_THREE_LINES = (
    'Epoch 3/19 \x1b[90m━━━━━━━━━━━━━━━━━━\x1b[0m 0/15 \x1b[2m0:00:25 • 0:00:00\x1b[0m \x1b[2;4m0.00it/s\x1b[0m '
    '\x1b[3mv_num: 0.000      \x1b[0m\n'
    '                                                              \x1b[3mtrain_loss: 3.264 \x1b[0m\n'
    '                                                              \x1b[3mval_loss: 3.063   \x1b[0m\n'
    '\x1b[2K\x1b[1A\x1b[2K\x1b[1A\x1b[2KEpoch 3/19 \x1b[35m━\x1b[0m\x1b[90m╺━━━━━━━━━━━━━━━━\x1b[0m 1/15 '
    '\x1b[2m0:00:01 • 0:00:08\x1b[0m \x1b[2;4m1.88it/s\x1b[0m \x1b[3mv_num: 0.000      \x1b[0m\n'
    '                                                              \x1b[3mtrain_loss: 3.101 \x1b[0m\n'
    '                                                              \x1b[3mval_loss: 3.063   \x1b[0m\n'
)


def test_lightning_rich_bar_with_its_metrics_one_a_line() -> None:
    rows = by_redraw(RICH_THREE_LINES)
    assert picked([r for r in rows if "loss" in r], "step", "loss") == [(45, 3.264), (46, 3.101)]
    assert picked([r for r in rows if "eval_loss" in r], "step", "eval_loss") == [(45, 3.063)]


# Lightning's Trainer(max_steps=3) over 2 batches an epoch (no max_epochs: Rich shows "Epoch E/-2"),
# its last epoch cut to 1 batch (captured through orch, tests/e2e/daily/test_self_spawning.py).
RICH_MAX_STEPS = (
    '\x1b[2KEpoch 0/-2 \x1b[90m━━━━━━━━━━\x1b[0m 0/2 \x1b[2m0:00:00 • -:--:--\x1b[0m \x1b[2;4m0.00it/s\x1b[0m \n'
    '\x1b[2KEpoch 0/-2 \x1b[35m━━━━━\x1b[0m\x1b[90m╺━━━━\x1b[0m 1/2 \x1b[2m0:00:01 • -:--:--\x1b[0m \x1b[2;4m0.00it/s\x1b[0m '
    '\x1b[3mtrain_loss: 1.256\x1b[0m\n'
    '\x1b[2KEpoch 1/-2 \x1b[90m━━━━━━━━━━\x1b[0m 0/1 \x1b[2m0:00:00 • -:--:--\x1b[0m \x1b[2;4m0.00it/s\x1b[0m '
    '\x1b[3mtrain_loss: 1.749\x1b[0m`Trainer.fit` stopped: `max_steps=3` reached.\n'
    '\x1b[2KEpoch 1/-2 \x1b[35m━━━━━━━━━━\x1b[0m 1/1 \x1b[2m0:00:01 • 0:00:00\x1b[0m \x1b[2;4m0.00it/s\x1b[0m '
    '\x1b[3mtrain_loss: 2.010\x1b[0m\n'
)


def test_lightning_rich_bar_of_a_max_steps_run_counts_the_cut_epoch_after_the_full_ones() -> None:
    rows = by_redraw(RICH_MAX_STEPS)  # one piece (no \r): the first row at once, the last kept, step 2 thinned
    assert picked([r for r in rows if "loss" in r], "step", "loss") == [(1, 1.256), (3, 2.01)]


def test_torchtune_bar() -> None:
    """torchtune's recipes set the bar's description to ``epoch|global step|Loss: x``
    (recipes/lora_finetune_single_device.py: ``f"{curr_epoch + 1}|{self.global_step}|Loss: {loss_to_log}"``)."""
    log = ("\r  0%|          | 0/20 [00:00<?, ?it/s]"
           "\r1|1|Loss: 11.904563903808594:   5%|\u258c         | 1/20 [00:01<00:19,  1.00s/it]"
           "\r1|2|Loss: 11.5:  10%|\u2588         | 2/20 [00:02<00:18,  1.00s/it]"
           "\r2|21|Loss: 9.25:   5%|\u258c         | 1/20 [00:01<00:19,  1.00s/it]\n")
    assert picked(by_redraw(log), "step", "epoch", "loss") == [(1, 1, 11.904563903808594), (2, 1, 11.5), (21, 2, 9.25)]
    assert picked(parse(log, 7), "step") == [(1,), (21,)]  # redrawn faster than BAR_ROW_S: the newest kept


def test_accelerate_no_trainer_eval_lines_take_the_bar_step() -> None:
    """accelerate's examples (run_clm_no_trainer.py): a tqdm bar without a loss, and
    ``logger.info(f"epoch {epoch}: perplexity: {perplexity} eval_loss: {eval_loss}")`` right
    after its last redraw: an eval row at the bar's step."""
    log = ("\r  0%|          | 0/20 [00:00<?, ?it/s]\r  5%|\u258c         | 1/20 [00:00<00:05,  3.50it/s]"
           "\r 50%|\u2588\u2588\u2588\u2588\u2588     | 10/20 [00:02<00:02,  3.50it/s]"
           "12/05/2026 12:00:00 - INFO - __main__ - epoch 0: perplexity: 1234.56 eval_loss: 7.118\n"
           "\r100%|\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588\u2588| 20/20 [00:05<00:00,  3.50it/s]"
           "12/05/2026 12:00:05 - INFO - __main__ - epoch 1: perplexity: 900.1 eval_loss: 6.8025\n")
    assert picked(parse(log, 11), "step", "epoch", "eval_loss") == [(10, 0, 7.118), (20, 1, 6.8025)]

"""Live status columns (step/total, loss, tokens/s, ETA, cost), `status -w`, `orch plot`
from the host's and from the fetched metrics.jsonl, and the follow progress line on a TTY."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.display.plot import draw, parse_metrics
from orchestrator.display.progress import FollowBar, row_fields
from tests.support.orch import Orch, write_job
from tests.support.sshd import SSHServer

WRITER = """import json, os, time
d = os.environ["ORCH_JOB_DIR"]
with open(os.path.join(d, "metrics.jsonl"), "w") as f:
    for step in range(1, 21):
        f.write(json.dumps({"time": time.time(), "step": step, "epoch": 0, "loss": 3 - step / 10, "lr": 1e-3 * step / 20,
                            "tokens_per_s": 5000.0 + step, "total_steps": 80}) + "\\n")
        if step % 10 == 0:
            f.write(json.dumps({"step": step, "eval_loss": 2.5 - step / 20, "eval_ppl": 9.0}) + "\\n")
    f.write(json.dumps({"time": time.time(), "step": 20, "epoch": 0, "loss": 1.2345, "lr": 1e-3,
                        "tokens_per_s": 5000.0, "total_steps": 80}) + "\\n")
while not os.path.exists(os.path.join(d, "go")):
    time.sleep(0.1)
"""

STEPS = """import sys, time
for step in range(1, 9):
    print("step %d/8 | epoch 0 | loss %.4f | lr 1.00e-03 | grad norm 1.000 | %d tok/s | 10 MiB" % (step, 1 - step / 16, 4000 + step), flush=True)
    time.sleep(0.05)
"""


def test_status_plot_and_fetched_metrics(orch: Orch, box: str, sshd: SSHServer) -> None:
    orch("hosts", "add", "box", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root), "--python", sys.executable, "--price-per-hour", "3.6")
    spec = write_job(orch.cwd, "curves", "box", ["python", "writer.py"])
    (orch.cwd / "ws" / "writer.py").write_text(WRITER)
    job = orch.json("submit", str(spec))["job_id"]
    deadline = time.time() + 60
    while (status := orch.json("status", job))["progress"]["step"] != 20 or status["state"] != "running":
        assert time.time() < deadline, status
        time.sleep(0.3)
    progress = status["progress"]
    assert progress["total"] == 80 and progress["loss"] == 1.2345 and progress["tokens_per_s"] == 5000.0
    assert progress["nodes"] == 1 and progress["eta_s"] is not None and progress["eta_s"] >= 0
    assert progress["cost"] == pytest.approx(3.6 * progress["elapsed_s"] / 3600, rel=0.5, abs=0.01)
    row = next(line for line in orch("status", "--wide").stdout.splitlines() if line.startswith(job))
    assert " running " in row and " 20/80 " in row and " 1.2345 " in row and " 5,000 " in row and " box" in row
    watched = orch("status", "-w", "--wide", "--interval", "0.2", "--iterations", "2").stdout
    assert job in watched and "20/80" in watched

    (orch.job_dir(job) / "go").touch()
    assert orch.wait_state(job, ("succeeded", "failed", "lost"))["state"] == "succeeded"
    out = orch("plot", job[:10], "-o", "curves.png")
    assert f"read box:{orch.remote_root}/jobs/{job}/metrics.jsonl: 21 loss, 2 eval_loss, 21 lr, 21 tokens_per_s" in out.stderr
    from PIL import Image

    png = orch.cwd / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    with Image.open(png) as image:
        assert image.size == (800, 900)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colours is not None and len(colours) > 50  # lines, labels, grid: not a blank canvas

    orch("fetch", job)
    fetched = orch.cwd / "runs" / job / "metrics.jsonl"
    fetched.write_text("\n".join(fetched.read_text().splitlines()[:5]) + "\n")  # tell the copies apart
    out = orch("plot", job)
    assert f"read runs/{job}/metrics.jsonl: 5 loss" in out.stderr
    assert (orch.cwd / "runs" / job / "curves.png").is_file() and out.stdout.strip() == f"runs/{job}/curves.png"


def test_plot_draws_every_point_and_skips_junk() -> None:
    text = "\n".join(json.dumps({"step": s, "loss": 2.0 / s, "lr": 0.1, "tokens_per_s": 10.0 * s}) for s in range(1, 31))
    text += "\n" + json.dumps({"step": 30, "eval_loss": 0.5}) + "\nnot json\n[1]\n" + json.dumps({"step": "x", "loss": 1})
    rows = parse_metrics(text + "\n" + json.dumps({"step": 31, "loss": float("nan")}).replace("NaN", "NaN"))
    fig = draw(rows, "t")
    ax_loss, ax_lr, ax_tps = fig.axes
    assert [len(line.get_xdata()) for line in ax_loss.lines] == [30, 1]
    assert len(ax_lr.lines[0].get_xdata()) == 30 and list(ax_tps.lines[0].get_ydata())[-1] == 300.0


def test_row_fields_eta_total_and_cost() -> None:
    status = {"state": "running", "started": 1000.0, "metrics": {"step": 25, "loss": 1.5, "time": 1100.0}}
    p = row_fields(status, created=900.0, nodes=2, total=100, price_per_hour=1.8, now=1110.0)
    assert (p.step, p.total, p.elapsed_s) == (25, 100, 110.0)
    assert p.eta_s == pytest.approx(75 * 4 - 10) and p.cost == pytest.approx(1.8 * 2 * 110 / 3600)
    assert p.cells()[:4] == ["running", "2", "25/100", "1.5000"] and p.cells()[5] == "4m50s"
    done = row_fields({"state": "succeeded", "started": 0.0, "ended": 7200.0, "stale": True,
                       "metrics": {"step": 3, "eval_loss": 0.25}}, 0.0, 1, None, None)
    assert done.cells() == ["succeeded (stale)", "1", "3", "eval 0.2500", "", "", "2h00m", ""]


def test_follow_shows_a_progress_line_on_a_terminal(orch: Orch) -> None:
    spec = write_job(orch.cwd, "bar", "local", ["python", "steps.py"])
    (orch.cwd / "ws" / "steps.py").write_text(STEPS)
    job = orch.json("submit", str(spec))["job_id"]
    primary, secondary = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "logs", job, "-f"], cwd=orch.cwd,
                            env={**orch.env, "TERM": "xterm", "COLUMNS": "120"},
                            stdin=subprocess.DEVNULL, stdout=secondary, stderr=secondary)
    os.close(secondary)
    chunks, deadline = [], time.time() + 60
    while time.time() < deadline:
        ready, _, _ = select.select([primary], [], [], 0.5)
        if ready:
            try:
                data = os.read(primary, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(primary)
    assert proc.wait(timeout=30) == 0
    screen = b"".join(chunks).decode("utf-8", "replace")
    assert "step 8/8 | epoch 0" in screen  # the log itself
    assert "loss 0.5000  4008 tok/s" in screen  # the progress line, not a log line


def test_follow_bar_reads_trainer_lines_split_across_chunks() -> None:
    from io import StringIO

    from rich.console import Console

    bar = FollowBar(Console(file=StringIO(), force_terminal=True))
    for chunk in ("noise\nstep 3/10 | epo", "ch 1 | loss 2.5000 | lr 1e-3 | grad norm 1 | 123 tok/s | 9 MiB\n"):
        bar.feed(chunk)
    task = bar.progress.tasks[0]
    assert (task.completed, task.total, task.fields["loss"], task.fields["tps"]) == (3, 10, "2.5000", "123")


def test_total_steps_fall_back_to_the_specs_max_steps(tmp_path: Path) -> None:
    from orchestrator.jobs.overview import _total_steps

    (tmp_path / "ws").mkdir()
    spec = tmp_path / "t.yaml"
    spec.write_text("name: t\nhosts: [local]\nworkspace: {path: ws}\n"
                    "train: {model: m, data: {train: d.jsonl}, max_steps: 123}\n")
    assert _total_steps(str(spec)) == 123
    assert _total_steps(str(tmp_path / "gone.yaml")) is None


def test_plot_without_matplotlib_names_the_right_install(orch: Orch, tmp_path: Path) -> None:
    blocker = tmp_path / "no-matplotlib"
    (blocker / "matplotlib").mkdir(parents=True)
    (blocker / "matplotlib" / "__init__.py").write_text("raise ImportError('matplotlib is not installed')\n")
    spec = write_job(orch.cwd, "noplot", "local", ["python", "-c", "print('{\"step\": 1, \"loss\": 2.0}')"])
    job = orch.json("submit", str(spec), "--follow")["job_id"]
    runs = orch.cwd / "runs" / job
    runs.mkdir(parents=True)
    (runs / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    out = orch("plot", job, check=2, env={"PYTHONPATH": f"{blocker}:{orch.env['PYTHONPATH']}"})
    assert "pip install matplotlib" in out.stderr and "'orch[plot]'" not in out.stderr and "Traceback" not in out.stderr

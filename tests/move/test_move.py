"""``orch resume JOB --on HOST`` (issue 14): a job stopped on one host continues on another
from its latest complete checkpoint and ends bit-identical to a run never interrupted;
the job keeps its id and history, the old copy stays; refusals are clear."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tests.conftest import Orch
from tests.movehelp import adapter, steps_logged, trainer_spec, wait_for


def test_a_moved_run_ends_bit_identical_to_an_uninterrupted_one(orch: Orch, box2: str, tiny_assets: Path) -> None:
    ref = json.loads(orch("submit", str(trainer_spec(orch, tiny_assets, "local", "ref")), "--follow", "--json",
                          timeout=600).stdout)
    assert ref["state"] == "succeeded"
    job = json.loads(orch("submit", str(trainer_spec(orch, tiny_assets, "local", "mv", delay=0.5)), "--json").stdout)["job_id"]
    old_dir = orch.job_dir(job)
    wait_for(lambda: (old_dir / "checkpoints" / "step-3" / "COMPLETE").exists(), "the first checkpoint")
    orch("cancel", job)
    assert orch.json("status", job)["state"] == "cancelled"
    stopped_at = max(int(p.name[5:]) for p in (old_dir / "checkpoints").glob("step-*"))
    assert stopped_at < 12, "the job ended before it could be moved"

    out = orch("resume", job, "--on", box2, "--follow", timeout=600)
    assert f"moving {job} to box2: checkpoint checkpoints/step-{stopped_at}" in out.stderr
    assert "Traceback" not in out.stderr

    status = orch.json("status", job)
    assert status["state"] == "succeeded" and status["hosts"] == ["box2"]
    new_dir = orch.remote_root / "box2" / "jobs" / job
    assert Path(status["job_dir"]) == new_dir and (new_dir / "moves.json").is_file()
    assert json.loads((old_dir / "status.json").read_text())["state"] == "cancelled"  # the old copy, untouched
    assert (old_dir / "checkpoints" / f"step-{stopped_at}" / "COMPLETE").is_file()
    shown = orch("show", job).stdout
    assert "local → box2" in shown

    for j in (ref["job_id"], job):
        orch("fetch", j)
    a, b = adapter(orch.cwd / "runs" / ref["job_id"]), adapter(orch.cwd / "runs" / job)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert steps_logged(orch.cwd / "runs" / job) == list(range(1, 13))  # history moved, each step once


def test_refusals_name_the_way_out(orch: Orch, box2: str) -> None:
    (orch.cwd / "ws").mkdir()
    (orch.cwd / "ws" / "tick.py").write_text("import time\nfor i in range(600):\n    print(i, flush=True)\n"
                                           "    time.sleep(0.1)\n")
    spec = orch.cwd / "tick.yaml"
    spec.write_text("name: tick\nhosts: [local]\nworkspace: {path: ws}\n"
                    "launch: {nproc_per_node: 1, command: [python, tick.py]}\n")
    job = json.loads(orch("submit", str(spec), "--json").stdout)["job_id"]
    orch.wait_state(job, ("running",))
    running = orch("resume", job, "--on", box2, check=2)
    assert "is running on local" in running.stderr and f"orch cancel {job}" in running.stderr
    same = orch("resume", job, "--on", "local", check=2)
    assert "already has a folder on local" in same.stderr
    twice = orch("resume", job, "--on", box2, "--on", "local", check=2)
    assert "ran on 1 node(s)" in twice.stderr
    unknown = orch("resume", job, "--on", "nosuch", check=2)
    assert "nosuch" in unknown.stderr
    orch("cancel", job)
    orch("hosts", "add", "dead", "--ssh", "ssh -p 1 root@127.0.0.1", "--root", "/tmp/x")
    dead = orch("resume", job, "--on", "dead", check=3)
    assert "dead" in dead.stderr and "Traceback" not in dead.stderr
    assert orch.json("status", job)["hosts"] == ["local"]  # nothing moved

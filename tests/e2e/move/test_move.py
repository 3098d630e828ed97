"""``orch resume JOB --on HOST`` (issue 14): a job stopped on one host continues on another
from its latest complete checkpoint and ends bit-identical to a run never interrupted;
the job keeps its id and history, the old copy stays; refusals are clear."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.moves import assert_same_run, reference_and_stopped, superseded
from tests.support.orch import Orch


def test_a_moved_run_ends_bit_identical_to_an_uninterrupted_one(orch: Orch, box2: str, tiny_assets: Path) -> None:
    ref, job, old_dir, stopped_at = reference_and_stopped(orch, tiny_assets)

    out = orch("resume", job, "--on", box2, "--follow", timeout=600)
    assert f"moving {job} to box2: checkpoint checkpoints/step-{stopped_at}" in out.stderr
    assert "Traceback" not in out.stderr

    status = orch.json("status", job)
    assert status["state"] == "succeeded" and status["hosts"] == ["box2"]
    new_dir = orch.remote_root / "box2" / "jobs" / job
    assert Path(status["job_dir"]) == new_dir and (new_dir / "moves.json").is_file()
    assert not old_dir.exists()  # the attempt left behind is set aside, never read as the job's again
    aside = superseded(old_dir.parent, job)
    assert json.loads((aside / "status.json").read_text())["state"] == "cancelled"  # kept as it was
    assert (aside / "checkpoints" / f"step-{stopped_at}" / "COMPLETE").is_file()
    assert f"{job}: its earlier folder on local (cancelled) is set aside as {aside}" in out.stderr
    shown = orch("show", job).stdout
    assert "local → box2" in shown and "left on local: its earlier folder on local (cancelled) is set aside" in shown

    assert_same_run(orch, ref, job)  # history moved: each step once


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

"""remote_payload/helper/reclaim.py on a real root: an interrupted gc's trash is removed by the
next one (never a gc's still at work), a workspace a sync holds stays, and what a removal frees
counts a hard-linked file only when every link to it goes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from remote_payload.contract.jobfolder import atomic_write_json
from remote_payload.helper import reclaim, workspace
from remote_payload.helper.agent import Agent
from remote_payload.jobdir import lease

RULE = {"dry_run": False, "keep_days": 0, "keep": 0, "fetched": [], "all_finished": True, "projects": [],
        "only": None, "jobs": None}


def finished_job(root: Path, job_id: str, payload: bytes) -> Path:
    d = root / "jobs" / job_id
    (d / "outputs").mkdir(parents=True)
    (d / "outputs" / "model.bin").write_bytes(payload)
    atomic_write_json(str(d / "job.json"), {"job_id": job_id, "project": "p-1"})
    atomic_write_json(str(d / "status.json"), {"state": "succeeded", "ended": 1.0, "supervisor_pid": 0})
    return d


def gc(root: Path, **args: Any) -> dict[str, Any]:
    agent = Agent(str(root), str(root / "payload" / "thisversion00000"))
    return reclaim.collect(str(root), agent.payload_dir, agent.probe, dict(RULE, **args), 5.0)


def test_an_interrupted_gcs_trash_is_removed_by_the_next_gc_never_a_running_ones(tmp_path: Path) -> None:
    root = tmp_path / "root"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = root / "jobs" / f".gc-{dead.stdout.strip()}-old-job"  # what a gc killed midway left
    (left / "checkpoints").mkdir(parents=True)
    (left / "checkpoints" / "w.bin").write_bytes(b"x" * 5000)
    busy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "serve"])  # a helper deleting its own
    try:
        working = root / "jobs" / f".gc-{busy.pid}-other-job"
        working.mkdir()
        assert Agent(str(root), "").unfinished() == []  # a trash name is never taken for a job
        assert Agent(str(root), "").status([left.name])["jobs"][left.name]["state"] == "unknown"
        done = gc(root)
        assert [(i["kind"], i["name"], i["bytes"]) for i in done["items"]] == [("temporary", f"jobs/{left.name}", 5000)]
        assert not left.exists() and working.is_dir()
    finally:
        busy.kill()
        busy.wait()


def test_a_file_linked_from_a_kept_folder_frees_nothing_one_linked_only_inside_counts_once(tmp_path: Path) -> None:
    root = tmp_path / "root"
    job = finished_job(root, "j-20261205-000000-abcd", b"m" * 3000)
    os.link(job / "outputs" / "model.bin", job / "outputs" / "copy.bin")  # both links go: its 3000 bytes, once
    kept = root / "workspace" / "p-1"
    kept.mkdir(parents=True)
    (job / "code").mkdir()
    (kept / "train.py").write_bytes(b"t" * 700)
    os.link(kept / "train.py", job / "code" / "train.py")  # the workspace keeps it: frees nothing
    freed = 3000 + sum((job / name).stat().st_size for name in ("job.json", "status.json"))
    listed = gc(root, dry_run=True, projects=["p-1"])
    assert [(i["name"], i["bytes"]) for i in listed["items"]] == [("jobs/j-20261205-000000-abcd", freed)]
    assert job.is_dir()
    removed = gc(root, projects=["p-1"], only=[i["name"] for i in listed["items"]])
    assert [(i["name"], i["bytes"]) for i in removed["items"]] == [("jobs/j-20261205-000000-abcd", freed)]
    assert not job.exists() and (kept / "train.py").read_bytes() == b"t" * 700


def test_a_workspace_whose_sync_lease_is_held_stays_and_goes_once_it_is_free(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for name in ("idle-1", "syncing-2"):
        (root / "workspace" / name).mkdir(parents=True)
        (root / "workspace" / name / "a.py").write_text("x")
        (root / "state").mkdir(exist_ok=True)
        atomic_write_json(str(root / "state" / f"sync-{name}.json"), {"files": {}, "generation": "g"})
    held = lease.acquire(workspace.record_lock(str(root), "syncing-2"), "receive syncing-2")
    try:
        done = gc(root)
        assert [i["name"] for i in done["items"]] == ["workspace/idle-1"] and done["kept"] == {"workspace a sync holds": 1}
        assert (root / "workspace" / "syncing-2" / "a.py").exists() and (root / "state" / "sync-syncing-2.json").exists()
    finally:
        held.release()
    assert [i["name"] for i in gc(root)["items"]] == ["workspace/syncing-2"]
    assert not (root / "state" / "sync-syncing-2.json").exists() and not list((root / "workspace").iterdir())

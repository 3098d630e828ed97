"""A job's own files on the server are untrusted input, each read on its own: one broken
job shows as broken and the others stay correct; size is bounded on both sides."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

from tests.support.orch import REPO, Orch, write_job


def running_again(orch: Orch, *jobs: str) -> None:
    """Make the registry ask the host again, as for a job it believes unfinished."""
    with closing(sqlite3.connect(orch.home / "registry.db")) as db, db:
        for job in jobs:
            db.execute("UPDATE jobs SET state='running' WHERE job_id=?", (job,))


def test_one_broken_status_json_leaves_the_other_jobs_correct(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "good", host, ["python", "-c", "import time; time.sleep(60)"])
    good = orch.json("submit", str(spec))["job_id"]
    orch.wait_state(good, ("running",))
    bad_spec = write_job(orch.cwd, "bad", host, ["python", "-c", "print(1)"])
    bad = json.loads(orch("submit", str(bad_spec), "--follow", "--json").stdout)["job_id"]
    status_file = orch.job_dir(bad) / "status.json"
    for junk in ('{"state": "running", "heartbeat": "soon", "supervisor_pid": "x"}', '{"state": "hacked"}',
                 "[1, 2]", '{"state": "running", "boot_id": ' + '"x' * 10 + '"}'):
        status_file.write_text(junk)
        running_again(orch, bad)
        statuses = {s["job_id"]: s for s in orch.json("status")}
        assert statuses[good]["state"] == "running" and not statuses[good].get("stale"), junk
        assert statuses[bad]["state"] in ("unknown", "lost") and not statuses[bad].get("stale"), junk
    orch("cancel", good, "--grace", "5")


def test_a_huge_status_json_is_refused_and_laptop_memory_stays_bounded(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "huge", host, ["python", "-c", "print(1)"])
    job = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]
    status_file = orch.job_dir(job) / "status.json"
    with open(status_file, "w") as f:  # 300 MB of a valid-looking status
        f.write('{"state": "running", "reason": "')
        chunk = "x" * (1 << 20)
        for _ in range(300):
            f.write(chunk)
        f.write('"}')
    running_again(orch, job)
    probe = ("import resource, subprocess, sys\n"
             "p = subprocess.run([sys.executable, '-m', 'orchestrator', 'status', sys.argv[1], '--json'],"
             " capture_output=True, text=True)\n"
             "print(p.stdout)\n"
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    out = subprocess.run([sys.executable, "-c", probe, job], cwd=orch.cwd, env={**orch.env, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=300)
    *body, maxrss = out.stdout.strip().splitlines()
    status = json.loads("\n".join(body))
    assert status["state"] == "unknown" and "bytes" in status["reason"]
    assert int(maxrss) < 300_000  # KiB: the laptop's orch stayed far below the file's 300 MB
    status_file.unlink()


def test_an_unreadable_output_never_makes_a_finished_job_fail(tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / "outputs").mkdir(parents=True)
    (job / "outputs" / "ok.bin").write_bytes(b"ok")
    (job / "outputs" / "locked.bin").write_bytes(b"secret")
    (job / "outputs" / "locked.bin").chmod(0)
    code = ("import json, sys\nfrom remote_payload.jobdir.manifest import build_manifest\n"
            "print(json.dumps([f['path'] for f in build_manifest(sys.argv[1])['files']]))\n")
    out = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search", sys.executable, "-c", code,
                          str(job)], capture_output=True, text=True, env={"PYTHONPATH": str(REPO)}, check=True)
    assert json.loads(out.stdout) == ["outputs/ok.bin"]

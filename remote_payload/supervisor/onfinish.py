"""What a supervisor does after its job ends (standard library only).

``after_end`` refreshes ``manifest.json`` with the environment record that the terminal state
did not wait for (``refresh_late``), and around it ``shutdown_when_done`` powers the node off
when ``on_finish.shutdown`` is set — only after ``orch fetch`` left the ``.fetched`` marker (or
the timeout passed; at once after a stop by ``max_cost``), never while another orch job runs or waits in the GPU queue on the host,
and not at all when the job was resumed meanwhile. Without it, a host with
``idle_shutdown_minutes`` gets the idle guard (``shutdown_when_idle``), which a queued job
keeps from arming as a running one does (both are work: ``other_jobs_running``).
"""

from __future__ import annotations

import glob
import os
import subprocess
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from remote_payload.contract.jobfolder import AWAITING_FETCH, atomic_write_json, read_json
from remote_payload.contract.protocol import QUEUED, TERMINAL
from remote_payload.jobdir.manifest import Flock, build_manifest, file_key
from remote_payload.jobdir.processes import pid_alive

FETCHED = ".fetched"


def other_jobs_running(root: str, job_id: str) -> List[str]:
    """The other orch jobs on this host with a live supervisor and no terminal state — running,
    setting up or queued for GPUs (named ``<id> (queued)``): all count as work."""
    running = []
    for path in glob.glob(os.path.join(root, "jobs", "*", "status.json")):
        st = read_json(path)
        if not isinstance(st, dict) or st.get("job_id") == job_id or st.get("state") in TERMINAL:
            continue
        if pid_alive(int(st.get("supervisor_pid") or 0), "supervisor"):
            running.append(str(st.get("job_id")) + (" (queued)" if st.get("state") == QUEUED else ""))
    return running


def refresh_late(job_dir: str, recorder: Any, attempt: int, written: Optional[tuple]) -> None:
    """The environment record (``repro.Recorder``) the terminal state did not wait for: wait for
    it, then refresh ``manifest.json`` with it — only while the job is still this ``attempt``'s
    and the file is still the one the supervisor wrote (``written``: its ``file_key``), under the
    job folder's flock (nobody else's manifest is ever replaced)."""
    if recorder is None or recorder.done():
        return
    recorder.wait()
    manifest_path = os.path.join(job_dir, "manifest.json")
    with Flock(job_dir):
        now = read_json(os.path.join(job_dir, "status.json")) or {}
        if now.get("attempt") != attempt or now.get("state") not in TERMINAL:
            return
        if written is None or file_key(manifest_path) != written:
            return
        try:
            atomic_write_json(manifest_path, build_manifest(job_dir, read_json(manifest_path)), compact=True)
        except OSError:
            pass  # the manifest written at the end stands: complete for what the job wrote


def after_end(job_dir: str, job: Dict[str, Any], attempt: int, recorder: Any, written: Optional[tuple],
              say: Callable[[str], None], spent: bool = False) -> None:
    """Once the terminal state is written: ``refresh_late`` in a thread of its own (a power-off
    waits for it — it waits for ``orch fetch`` anyway), then ``shutdown_when_done`` (``spent``:
    the job's budget stopped it); returns when both are done."""
    late = threading.Thread(target=refresh_late, args=(job_dir, recorder, attempt, written), name="orch-repro-late")
    late.start()
    if (job.get("on_finish") or {}).get("shutdown"):
        late.join()
    shutdown_when_done(job_dir, job, attempt, say, spent)
    late.join()


def shutdown_when_done(job_dir: str, job: Dict[str, Any], attempt: int, say: Callable[[str], None],
                       spent: bool = False) -> None:
    """``on_finish.shutdown`` (and ``power_off``): power off once ``orch fetch`` has confirmed the
    outputs or its timeout passed — at once when ``spent``, a job its ``max_cost`` stopped
    (waiting would bill past the budget; a powered-off box keeps its disk for a later fetch);
    never while another orch job works on the host. Without it, the idle guard."""
    cfg = job.get("on_finish") or {}
    if not cfg.get("shutdown"):
        if cfg.get("idle_shutdown_minutes"):
            shutdown_when_idle(job_dir, job, float(cfg["idle_shutdown_minutes"]), say)
        return
    timeout = 0.0 if spent else float(cfg.get("shutdown_after_fetch_timeout_s", 1800))
    marker = os.path.join(job_dir, FETCHED)
    say("on_finish.shutdown: max_cost reached, powering off without waiting for `orch fetch`" if spent else
        "on_finish.shutdown: waiting for `orch fetch` (at most %.0f s) before powering off" % timeout)
    open(os.path.join(job_dir, AWAITING_FETCH), "a").close()  # move_list need not wait for this supervisor
    deadline = time.time() + timeout
    while not os.path.exists(marker) and time.time() < deadline:
        time.sleep(0.5)
        if int((read_json(os.path.join(job_dir, "status.json")) or {}).get("attempt", attempt)) != attempt:
            say("the job was resumed: this supervisor does not shut down")
            return
    if not spent:
        say("outputs fetched" if os.path.exists(marker) else "no fetch within %.0f s" % timeout)
    root = os.path.dirname(os.path.dirname(job_dir))
    others = other_jobs_running(root, job["job_id"])
    if others:
        say("not shutting down: other orch jobs run here (%s)" % ", ".join(others))
        return
    argv = list(cfg.get("shutdown_command") or ["shutdown", "-h", "now"])
    say("shutting down: %s" % " ".join(argv))
    subprocess.run(argv, check=False)


def shutdown_when_idle(job_dir: str, job: Dict[str, Any], minutes: float, say: Callable[[str], None]) -> None:
    """The host's idle guard, armed by the supervisor of a job that ends with no other orch
    job running: power off after ``minutes`` unless a job started meanwhile (its supervisor
    takes over the guard when it ends)."""
    root = os.path.dirname(os.path.dirname(job_dir))
    if other_jobs_running(root, job["job_id"]):
        return
    armed = time.time()
    say("idle guard: powering off in %.1f min unless another orch job starts" % minutes)
    deadline = armed + 60 * minutes
    while time.time() < deadline:
        time.sleep(min(5.0, max(deadline - time.time(), 0.05)))
        for path in glob.glob(os.path.join(root, "jobs", "*", "status.json")):
            st = read_json(path)
            if isinstance(st, dict) and st.get("job_id") != job["job_id"] and float(st.get("started") or 0) > armed:
                say("idle guard: %s started; this guard stands down" % st.get("job_id"))
                return
    argv = list((job.get("on_finish") or {}).get("shutdown_command") or ["shutdown", "-h", "now"])
    say("idle guard: no orch job for %.1f min, shutting down: %s" % (minutes, " ".join(argv)))
    subprocess.run(argv, check=False)

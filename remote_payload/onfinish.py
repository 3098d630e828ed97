"""What a supervisor records about its node, and what it does after the job ends.

Standard library only. ``record_environment`` writes ``repro/environment.json`` (python,
torch, CUDA, GPUs) and ``repro/pip-freeze.txt`` atomically. ``shutdown_when_done`` powers
the node off when ``on_finish.shutdown`` is set — only after ``orch fetch`` left the
``.fetched`` marker (or the timeout passed), never while another orch job runs on the host,
and not at all when the job was resumed meanwhile.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import time
from typing import Any, Callable, Dict, List

from remote_payload.common import TERMINAL, atomic_write_json, pid_alive, read_json

FETCHED = ".fetched"
PROBE = (
    "import json, platform, sys\n"
    "out = {'python': sys.version.split()[0], 'executable': sys.executable, 'platform': platform.platform()}\n"
    "try:\n"
    "    import torch\n"
    "    out.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())\n"
    "except Exception as exc:\n"
    "    out['torch'] = 'unavailable: %s' % exc\n"
    "print(json.dumps(out))\n"
)


def _run(argv: List[str], timeout: float = 60) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def record_environment(job_dir: str, python: str) -> None:
    repro = os.path.join(job_dir, "repro")
    os.makedirs(repro, exist_ok=True)
    env: Dict[str, Any] = {}
    try:
        env = json.loads(_run([python, "-c", PROBE]) or "{}")
    except ValueError:
        pass
    env["gpus"] = [line for line in _run(["nvidia-smi", "-L"], 20).splitlines() if line.startswith("GPU ")]
    freeze = _run([python, "-m", "pip", "freeze"], 120)
    tmp = os.path.join(repro, "pip-freeze.txt.tmp.%d" % os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(freeze)
    os.replace(tmp, os.path.join(repro, "pip-freeze.txt"))
    atomic_write_json(os.path.join(repro, "environment.json"), env)


def other_jobs_running(root: str, job_id: str) -> List[str]:
    running = []
    for path in glob.glob(os.path.join(root, "jobs", "*", "status.json")):
        st = read_json(path)
        if not isinstance(st, dict) or st.get("job_id") == job_id or st.get("state") in TERMINAL:
            continue
        if pid_alive(int(st.get("supervisor_pid") or 0), "supervisor"):
            running.append(str(st.get("job_id")))
    return running


def shutdown_when_done(job_dir: str, job: Dict[str, Any], attempt: int, say: Callable[[str], None]) -> None:
    cfg = job.get("on_finish") or {}
    if not cfg.get("shutdown"):
        return
    timeout = float(cfg.get("shutdown_after_fetch_timeout_s", 1800))
    marker = os.path.join(job_dir, FETCHED)
    say("on_finish.shutdown: waiting for `orch fetch` (at most %.0f s) before powering off" % timeout)
    deadline = time.time() + timeout
    while not os.path.exists(marker) and time.time() < deadline:
        time.sleep(0.5)
        if int((read_json(os.path.join(job_dir, "status.json")) or {}).get("attempt", attempt)) != attempt:
            say("the job was resumed: this supervisor does not shut down")
            return
    say("outputs fetched" if os.path.exists(marker) else "no fetch within %.0f s" % timeout)
    root = os.path.dirname(os.path.dirname(job_dir))
    others = other_jobs_running(root, job["job_id"])
    if others:
        say("not shutting down: other orch jobs run here (%s)" % ", ".join(others))
        return
    argv = list(cfg.get("shutdown_command") or ["shutdown", "-h", "now"])
    say("shutting down: %s" % " ".join(argv))
    subprocess.run(argv, check=False)

"""What starting ``orch`` costs, against a bare ``python -c pass``.

Rows, each run as a user runs it (``python -m orchestrator ...``, piped, its own throwaway
``ORCH_HOME``):

- ``orch --help``;
- ``orch status`` with 50 finished jobs in the registry (recorded through the registry's own
  API as orch records them; one ``orch status`` before the runs records their final rows, as
  the first status after a job ends does) — no host is asked;
- ``orch logs JOB`` of a finished job on the built-in ``local`` host: the CLI start plus one
  round trip to the host (a local helper process); the row under it imports what that command
  imports and stops, to show the start alone.

Goal (issue "the fast loop", goal 4): each ≤ 0.15 s above bare python for the CLI start, plus one
round trip only where the network is needed. Runs are interleaved (every case once per round);
each cell is the median of ``--repeat`` rounds (≥ 5).

    .venv/bin/python bench/cli_start.py [--repeat 9]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, machine, median, table

GOAL_S = 0.15
JOBS = 50
SCRIPT = 'print("hello from the job")\nprint("bye")\n'


def finished_jobs(home: Path, count: int) -> None:
    """``count`` terminal jobs on ``local``, recorded through the real registry API."""
    sys.path.insert(0, str(REPO))
    from orchestrator.state.registry import SUBMITTING, Registry

    registry = Registry(home)
    for i in range(count):
        job_id = f"bench-20261129-10{i // 60:02d}{i % 60:02d}-{i:04x}"
        state = ("succeeded", "failed", "cancelled")[i % 3]
        registry.add(job_id, "bench", str(home / "gone.yaml"), ["local"], f"/r/jobs/{job_id}", SUBMITTING)
        registry.update(job_id, "pending", {})
        registry.update(job_id, state, {
            "state": state, "started": 1000.0, "ended": 1000.0 + 60 * (i + 1),
            "exit_code": 0 if state == "succeeded" else 1,
            "reason": None if state == "succeeded" else f"rank 0 on node 0: RuntimeError: step {i} (exit code 1)",
            "metrics": {"step": 10 * i, "total_steps": 500, "loss": 2.0 / (i + 1), "tokens_per_s": 1000.0 + i}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    repeat = max(args.repeat, 5)
    tmp = Path(tempfile.mkdtemp(prefix="orch-bench-start-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    env.update(ORCH_HOME=str(tmp / "home"), PYTHONPATH=str(REPO))
    orch = [sys.executable, "-m", "orchestrator"]
    try:
        (tmp / "home").mkdir()
        (tmp / "ws").mkdir()
        (tmp / "ws" / "m.py").write_text(SCRIPT)
        (tmp / "job.yaml").write_text('name: bench\nhosts: [local]\nworkspace: {path: ws}\n'
                                      'launch:\n  nproc_per_node: 1\n  command: ["python", "m.py"]\n')
        out = subprocess.run([*orch, "submit", "job.yaml", "--follow", "--json"], cwd=tmp, env=env,
                             capture_output=True, text=True, timeout=300, check=True).stdout
        job = json.loads(out)["job_id"]
        finished_jobs(tmp / "home", JOBS - 1)
        first = time.perf_counter()
        subprocess.run([*orch, "status"], cwd=tmp, env=env, capture_output=True, check=True)
        first = time.perf_counter() - first
        cases = {
            "bare `python -c pass`": [sys.executable, "-c", "pass"],
            "`orch --help`": [*orch, "--help"],
            f"`orch status` ({JOBS} finished jobs)": [*orch, "status"],
            "`orch logs JOB` (finished, `local`)": [*orch, "logs", job],
            "  its start alone (imports, no round trip)":
                [sys.executable, "-c", "import orchestrator.cli.main as m, orchestrator.cli.logs"],
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(repeat):
            for name, argv in cases.items():
                t0 = time.perf_counter()
                subprocess.run(argv, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               check=True)
                times[name].append(time.perf_counter() - t0)
        bare = median(times["bare `python -c pass`"])
        rows = []
        for name in cases:
            value = median(times[name])
            over = value - bare
            goal = "" if name.startswith("bare") else (f"≤ {GOAL_S:.2f}" if "logs" not in name
                                                       else f"≤ {GOAL_S:.2f} + 1 round trip")
            met = "" if not goal or "+ 1 round trip" in goal else ("yes" if over <= GOAL_S else "no")
            rows.append([name, f"{value:.3f}", "" if name.startswith("bare") else f"{over:+.3f}", goal, met])
        print(f"# orch CLI start — {machine()}")
        print(f"median of {repeat} interleaved rounds, seconds; `orch` run as `python -m orchestrator`, piped\n")
        print(table(["case", "median s", "over bare s", "goal (over bare)", "met"], rows))
        print(f"\nthe first `orch status` after {JOBS} jobs ended (records their final rows, once): {first:.3f} s")
        print(f"load avg at end {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

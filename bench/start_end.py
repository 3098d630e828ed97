"""Start and end of a one-process job: ``orch submit --follow`` against a bare start.

For a job whose script writes a timestamp as its first line, prints one line, and writes a
timestamp as its last line, on the built-in ``local`` host and on a loopback sshd
(``tests/support/sshd.py``), as a user runs it (``python -m orchestrator submit job.yaml --follow
--json``, its own ``ORCH_HOME``, host added with ``--trust``, workspace already synced):

- **start**: from running ``orch submit`` to the script's first line, against the anchor —
  ``setsid python script.py`` on ``local``; for the sshd the same through a warm OpenSSH
  ControlMaster (``ssh -o ControlMaster=auto -o ControlPath=... -o ControlPersist=60 host
  'setsid -f python script.py'``, the master opened before the runs). Goal: ≤ anchor + 1.0 s.
- **end**: from the script's last line to ``orch submit --follow`` returning. Goal: ≤ 0.5 s.
  Split at the ``ended`` time the supervisor wrote into status.json: the supervisor's part
  (job exit → terminal state) and the follower's (terminal state → the CLI returned).

orch rows: ``launch.launcher: direct`` (what ``auto`` picks for one process) with a job that
ends at once, the same with a job that runs 2 s (its follower is attached when it ends), and,
for comparison, ``torchrun``. Runs are interleaved (anchor, direct, torchrun, per host, per
round); every cell is the median of ``--repeat`` runs (≥ 5). Times come from ``time.time()``
on one machine, so the script's own timestamps and the bench's share a clock.

    .venv/bin/python bench/start_end.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common
from common import machine, median, start_sshd, table

SCRIPT = """\
import sys, time
t0 = time.time()
open(sys.argv[1] + ".first", "w").write(repr(t0))
print("hello from the job", flush=True)
time.sleep(float(sys.argv[2]))
open(sys.argv[1] + ".last", "w").write(repr(time.time()))
"""


# (row, launcher, seconds the job sleeps between its first and last line): a job that ends at
# once measures the follower's own start too (it connects after submit returns); one that runs
# 2 s is already followed when it ends, like any real job.
KINDS = (("direct", "direct", 0.0), ("direct, 2 s job", "direct", 2.0), ("torchrun", "torchrun", 0.0))


def read_ts(path: Path, timeout: float = 120) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            return float(path.read_text())
        except (OSError, ValueError):
            time.sleep(0.005)
    raise TimeoutError(f"no timestamp in {path}")


def orch_run(env: dict[str, str], cwd: Path, host: str, launcher: str, mark: Path, root: Path,
             sleep: float = 0.0) -> dict[str, float]:
    spec = cwd / f"job-{host}-{launcher}.yaml"
    spec.write_text(f"name: se-{host}-{launcher}\nhosts: [{host}]\nworkspace: {{path: ws}}\n"
                    f"launch:\n  nproc_per_node: 1\n  launcher: {launcher}\n"
                    f"  command: {json.dumps(['python', 'probe.py', str(mark), str(sleep)])}\n")
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "submit", str(spec), "--follow", "--json"],
                          cwd=cwd, env=env, capture_output=True, text=True)
    returned = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"orch submit exited {proc.returncode}: {proc.stdout}\n{proc.stderr}")
    job = json.loads(proc.stdout)["job_id"]
    status = json.loads((root / "jobs" / job / "status.json").read_text())
    first, last = read_ts(Path(f"{mark}.first")), read_ts(Path(f"{mark}.last"))
    return {"start": first - t0, "end": returned - last, "end_server": status["ended"] - last,
            "end_follow": returned - status["ended"], "supervisor": status["started"] - t0}


def anchor_local(mark: Path, script: Path) -> dict[str, float]:
    t0 = time.time()
    proc = subprocess.Popen(["setsid", sys.executable, str(script), str(mark), "0"], stdout=subprocess.DEVNULL)
    first = read_ts(Path(f"{mark}.first"))
    proc.wait()
    returned = time.time()
    return {"start": first - t0, "end": returned - read_ts(Path(f"{mark}.last"))}


def anchor_ssh(ssh: list[str], mark: Path, script: Path) -> dict[str, float]:
    """Start: a detached ``setsid -f`` through the warm master. End: the same command run in
    the foreground (ssh returns when it exits) — the floor for any follower."""
    t0 = time.time()
    subprocess.run([*ssh, shlex.join(["setsid", "-f", sys.executable, str(script), str(mark), "0"])], check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    start = read_ts(Path(f"{mark}.first")) - t0
    read_ts(Path(f"{mark}.last"))
    fg = Path(f"{mark}-fg")
    subprocess.run([*ssh, shlex.join([sys.executable, str(script), str(fg), "0"])], check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return {"start": start, "end": time.time() - read_ts(Path(f"{fg}.last"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="orch-bench-se-"))
    tmp.chmod(0o755)
    server = start_sshd(tmp / "sshd")
    control = tmp / "cm.sock"
    ssh = ["ssh", "-p", str(server.port), "-i", str(server.client_key), *common.SSH_OPTS,
           "-o", "ControlMaster=auto", "-o", f"ControlPath={control}", "-o", "ControlPersist=60", "root@127.0.0.1"]
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
        env.update(ORCH_HOME=str(tmp / "home"), PYTHONPATH=str(common.REPO))
        laptop = tmp / "laptop"
        (laptop / "ws").mkdir(parents=True)
        script = laptop / "ws" / "probe.py"
        script.write_text(SCRIPT)
        marks = tmp / "marks"
        marks.mkdir()
        roots = {"local": tmp / "home" / "local", "box": tmp / "remote"}
        subprocess.run([sys.executable, "-m", "orchestrator", "hosts", "add", "box", "--ssh",
                        f"ssh -p {server.port} root@127.0.0.1", "--identity", str(server.client_key),
                        "--root", str(roots["box"]), "--python", sys.executable, "--trust"],
                       env=env, check=True, capture_output=True)
        subprocess.run([*ssh, "true"], check=True)  # opens the ControlMaster: the anchor is warm
        n = 0
        for host in roots:  # untimed: payload install and the first sync
            n += 1
            orch_run(env, laptop, host, "direct", marks / f"m{n}", roots[host])
        results: dict[tuple[str, str], list[dict[str, float]]] = {}
        for _ in range(args.repeat):
            for host in roots:
                n += 1
                a = anchor_local(marks / f"m{n}", script) if host == "local" else anchor_ssh(ssh, marks / f"m{n}", script)
                results.setdefault((host, "anchor"), []).append(a)
                for kind, launcher, sleep in KINDS:
                    n += 1
                    results.setdefault((host, kind), []).append(
                        orch_run(env, laptop, host, launcher, marks / f"m{n}", roots[host], sleep))
    finally:
        subprocess.run(["ssh", "-o", f"ControlPath={control}", "-O", "exit", "x"], capture_output=True)
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    def med(host: str, kind: str, key: str) -> float:
        return median([r[key] for r in results[(host, kind)]])

    print(f"# orch submit --follow: start and end of a one-process job — {machine()}")
    print(f"median of {args.repeat} interleaved runs; anchors: `setsid python` (local), warm ControlMaster "
          "`ssh ... 'setsid -f python'` (sshd)\n")
    rows = []
    for host, label in (("local", "local"), ("box", "loopback sshd")):
        anchor_start = med(host, "anchor", "start")
        for kind, _, _ in KINDS:
            start = med(host, kind, "start")
            rows.append((f"{label}, {kind}", anchor_start, start, f"{start - anchor_start:+.2f}",
                         "met" if start - anchor_start <= 1.0 else "not met",
                         med(host, "anchor", "end"), med(host, kind, "end"),
                         "met" if med(host, kind, "end") <= 0.5 else "not met"))
    print(table(["host, launcher", "anchor start s", "orch start s", "Δ start s", "≤ +1.0 s",
                 "anchor end s", "orch end s", "≤ 0.5 s"], rows))
    print("\nwhere the time goes (medians, s):\n")
    parts = []
    for host, label in (("local", "local"), ("box", "loopback sshd")):
        for kind, _, _ in KINDS:
            parts.append((f"{label}, {kind}", med(host, kind, "supervisor"),
                          med(host, kind, "start") - med(host, kind, "supervisor"),
                          med(host, kind, "end_server"), med(host, kind, "end_follow")))
    print(table(["host, launcher", "submit → supervisor", "supervisor → first line", "exit → terminal state",
                 "terminal state → CLI returned"], parts))


if __name__ == "__main__":
    main()

"""``orch submit`` until the job's process runs vs a raw ``ssh host 'setsid -f cmd'``.

On loopback and through a 20 ms / 100 Mbit/s link (``bench/latency_proxy.py``), against one
real loopback sshd (``tests/sshd.py``). orch runs as a user runs it: the CLI in a subprocess,
``python -m orchestrator submit job.yaml --json``, with its own ``ORCH_HOME`` and a host added
with ``orch hosts add --trust``; the workspace (a few files) is already synced by an untimed
first submit, so the timed ones sync nothing. The job's command is ``touch MARKER``, run by
torchrun (``--no-python``); the anchor runs the same ``touch`` under ``setsid -f``.

Times from the start of the command: ``orch returned`` (the CLI exited), ``supervisor`` (the
supervisor wrote ``<root>/jobs/<id>/status.json``: orch's own work is done), ``marker`` (the
job's process ran: torchrun's start-up included). Median of ``--repeat`` runs, orch and the
anchor alternating; each job is left to finish before the next run starts.

    .venv/bin/python bench/submit.py [--repeat 3] [--delay-ms 20] [--mbit 100]
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import common
from common import machine, median, ssh_argv, table


def new_status_files(jobs: Path, seen: set[str]) -> list[Path]:
    try:
        names = [e.name for e in os.scandir(jobs) if e.name not in seen and not e.name.startswith(".")]
    except FileNotFoundError:
        return []
    return [jobs / n / "status.json" for n in names if (jobs / n / "status.json").exists()]


def wait_terminal(status: Path, timeout: float = 120) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            state = json.loads(status.read_text())["state"]
        except (OSError, ValueError, KeyError):
            state = ""
        if state in ("succeeded", "failed", "cancelled"):
            return state
        time.sleep(0.05)
    return "timeout"


def orch_submit(env: dict[str, str], cwd: Path, host: str, ws: Path, root: Path, marker: Path) -> dict[str, float]:
    spec = cwd / f"job-{host}.yaml"
    spec.write_text(f"name: bench-{host}\nhosts: [{host}]\nworkspace: {{path: {ws.name}}}\n"
                    f"launch:\n  nproc_per_node: 1\n  command: {json.dumps(['touch', str(marker)])}\n")
    jobs = root / "jobs"
    seen = {e.name for e in os.scandir(jobs)} if jobs.is_dir() else set()
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "submit", str(spec), "--json"], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    status: Path | None = None
    deadline = t0 + 120
    while len(out) < 3 and time.perf_counter() < deadline:
        now = time.perf_counter()
        if "returned" not in out and proc.poll() is not None:
            out["returned"] = now - t0
            if proc.returncode != 0:
                raise RuntimeError(f"orch submit exited {proc.returncode}: {proc.stderr.read().decode()}")
        if status is None:
            found = new_status_files(jobs, seen)
            if found:
                status = found[0]
                out["supervisor"] = now - t0
        if "marker" not in out and marker.exists():
            out["marker"] = now - t0
        time.sleep(0.002)
    proc.wait()
    if status is None or "marker" not in out:
        raise RuntimeError(f"job did not start: {proc.stdout.read().decode()} {proc.stderr.read().decode()}")
    wait_terminal(status)
    return out


def anchor(port: int, key: Path, marker: Path) -> dict[str, float]:
    remote = shlex.join(["setsid", "-f", "sh", "-c", shlex.join(["touch", str(marker)])])
    t0 = time.perf_counter()
    subprocess.run([*ssh_argv(port, key), "root@127.0.0.1", remote], check=True, stdin=subprocess.DEVNULL)
    returned = time.perf_counter() - t0
    done = common.wait_for(marker.exists, timeout=30) - t0
    return {"returned": returned, "marker": done}


def main() -> None:
    args = common.link_args(__doc__.split("\n\n")[0])
    with common.sshd_and_proxy("orch-bench-submit-", args) as (tmp, server, proxy):
        env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
        env.update(ORCH_HOME=str(tmp / "home"), PYTHONPATH=str(common.REPO))
        laptop = tmp / "laptop"
        ws = laptop / "ws"
        ws.mkdir(parents=True)
        (ws / "train.py").write_text("print('hello')\n")
        (ws / "requirements.txt").write_text("\n")
        (ws / "conf").mkdir()
        (ws / "conf" / "base.yaml").write_text("lr: 0.001\n")
        markers = tmp / "markers"
        markers.mkdir()

        # --help: python start-up plus importing the CLI, paid by every orch command.
        helps = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "orchestrator", "--help"], env=env, check=True, capture_output=True)
            helps.append(time.perf_counter() - t0)

        print(f"# orch submit vs ssh 'setsid -f cmd' — {machine()}")
        print(f"median of {args.repeat}; proxy: {args.delay_ms:g} ms each way, {args.mbit:g} Mbit/s each way; "
              f"`orch --help` (python start + CLI imports): {median(helps):.2f} s\n")
        rows, firsts = [], []
        n = 0
        for label, port in (("loopback", server.port), ("proxy", proxy.port)):
            host, root = f"b-{label}", tmp / f"remote-{label}"
            subprocess.run([sys.executable, "-m", "orchestrator", "hosts", "add", host, "--ssh",
                            f"ssh -p {port} root@127.0.0.1", "--identity", str(server.client_key), "--root", str(root),
                            "--python", sys.executable, "--trust"], env=env, check=True, capture_output=True)
            n += 1
            first = orch_submit(env, laptop, host, ws, root, markers / f"m{n}")  # installs the payload, syncs ws
            firsts.append((label, first["returned"], first["supervisor"], first["marker"]))
            o: dict[str, list[float]] = {}
            a: dict[str, list[float]] = {}
            for _ in range(args.repeat):
                n += 1
                for k, v in anchor(port, server.client_key, markers / f"m{n}").items():
                    a.setdefault(k, []).append(v)
                n += 1
                for k, v in orch_submit(env, laptop, host, ws, root, markers / f"m{n}").items():
                    o.setdefault(k, []).append(v)
            anchor_s = median(a["marker"])
            for what, key in (("command returned", "returned"), ("supervisor running", "supervisor"),
                              ("job process running", "marker")):
                if key == "supervisor":
                    rows.append((f"{what} ({label})", median(o[key]), "—", f"{median(o[key]) / anchor_s:.2f}"))
                else:
                    s = median(a[key])
                    rows.append((f"{what} ({label})", median(o[key]), s, f"{median(o[key]) / s:.2f}"))
            torchrun = median([m - s for m, s in zip(o["marker"], o["supervisor"])])
            rows.append((f"supervisor → job process: torchrun ({label})", torchrun, "—", "—"))

        print(table(["from the start of the command until", "orch s", "ssh s", "orch/ssh"], rows))
        print("\n(ssh has no supervisor: its 'supervisor running' ratio is against the ssh anchor's process running.)")
        print("\nfirst submit to a fresh host (payload install + sync of the small workspace; 1 run):\n")
        print(table(["link", "returned s", "supervisor s", "job process s"], firsts))


if __name__ == "__main__":
    main()

"""DDP scaling on CPU: tokens/s of the built-in trainer at 1, 2 and 4 processes on one node
and 2 nodes × 2 processes across network namespaces (issue 5).

    .venv/bin/python bench/scaling.py [--steps 40]

Every run is a real `orch submit` of the same LoRA job on the tiny GPT-2 (fp32, batch 4 per
process, seq 64): on the built-in `local` host for 1×1, 1×2, 1×4, and on two namespaced
sshd nodes (tests/netns.py, needs root) for 2×2. Throughput is the mean of the trainer's own
`tokens_per_s` (all processes) over the logged steps after the first 5. Efficiency =
tokens/s ÷ (processes × the 1-process tokens/s). Every process runs 1 thread
(OMP_NUM_THREADS=1, as torchrun sets for more than one process), so the rows compare
processes, not thread pools. Prints a markdown table; not a test.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

from make_tiny_assets import make_tiny_assets  # noqa: E402

from tests.netns import start_cluster  # noqa: E402


def orch(home: Path, cwd: Path, *args: str) -> str:
    env = dict(os.environ, ORCH_HOME=str(home), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"orch {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout


def run(home: Path, work: Path, hosts: list[str], nproc: int, steps: int, roots: dict[str, Path]) -> float:
    spec = work / f"scale-{len(hosts)}x{nproc}.yaml"
    spec.write_text(json.dumps({
        "name": f"scale-{len(hosts)}x{nproc}", "hosts": hosts, "workspace": {"path": "ws"},
        "launch": {"nproc_per_node": nproc}, "env": {"OMP_NUM_THREADS": "1"},
        "train": {"model": "assets/tiny-gpt2", "finetune": "lora", "lora": {"target_modules": ["c_attn"]},
                  "data": {"train": "assets/data/train.jsonl", "max_length": 64}, "precision": "fp32",
                  "batch_size": 4, "max_steps": steps, "log_every": 1, "eval_every": 100000, "save_every": 100000},
    }))
    result = json.loads(orch(home, work, "submit", str(spec), "--follow", "--json"))
    if result["state"] != "succeeded":
        raise SystemExit(f"{spec.name}: {result}")
    for root in roots.values():
        metrics = root / "jobs" / result["job_id"] / "metrics.jsonl"
        if metrics.exists():
            rows = [json.loads(l) for l in metrics.read_text().splitlines()]
            speeds = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r.get("step", 0) > 5]
            return sum(speeds) / len(speeds)
    raise SystemExit(f"{spec.name}: no metrics.jsonl found")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orch-scaling-"))
    home = work / "home"
    make_tiny_assets(work / "ws" / "assets")
    roots = {"local": home / "local"}
    rows = []
    for nproc in (1, 2, 4):
        rows.append((f"1 node × {nproc}", nproc, run(home, work, ["local"], nproc, args.steps, roots)))
    if os.geteuid() == 0 and shutil.which("ip"):
        cluster = start_cluster(work / "cluster")
        try:
            names = []
            for node in cluster.nodes:
                roots[node.name] = work / "remote" / node.name
                orch(home, work, "hosts", "add", node.name, "--ssh", f"ssh root@{node.address}", "--identity",
                     str(cluster.client_key), "--root", str(roots[node.name]), "--python", sys.executable, "--trust")
                names.append(node.name)
            rows.append(("2 nodes × 2 (netns)", 4, run(home, work, names, 2, args.steps, roots)))
        finally:
            cluster.teardown()
    base = rows[0][2]
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, tiny GPT-2 LoRA, fp32, batch 4/process, seq 64, "
          f"{args.steps} steps\n")
    print("| layout | processes | tokens/s | speed-up | efficiency |")
    print("|---|---|---|---|---|")
    for name, procs, speed in rows:
        print(f"| {name} | {procs} | {speed:,.0f} | {speed / base:.2f}× | {speed / base / procs:.0%} |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

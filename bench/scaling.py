"""DDP scaling on CPU: how much of a bare DDP loop's 1 -> 2 process speed-up the built-in trainer
and HF `Trainer` keep (issue 12), and, behind `--submit`, `orch submit` at 1/2/4 processes and
2 nodes x 2 network namespaces (issue 5).

    .venv/bin/python bench/scaling.py [--steps 30] [--warmup 10] [--repeat 5] [--repo PATH]
    .venv/bin/python bench/scaling.py --submit [--steps 40]      # the orch submit table (root for netns)

Default table, for full fine-tuning and LoRA: GPT-2 4 layers x 256 (random init, the tiny BPE
tokenizer), text rows of exactly 128 tokens (no padding anywhere, so only DDP overhead differs),
batch 8 per process, fp32, fused AdamW, clipping at 1.0, under torchrun with 1 process x 1 thread
(1x1) and 2 processes x 1 thread (2x1). Measured: tokens/s over all processes in the steps after
the warm-up (bench/trainer.py's workers and run_ours, counted the same way); speed-up =
tokens/s(2x1) / tokens/s(1x1) of the same round; "vs bare" = speed-up / the bare loop's speed-up
in that round (goal >= 0.95). Cells: median (min-max) over `--repeat` interleaved rounds (each
round runs every cell once, in a rotated order). Not a test: machines are noisy.

`--submit`: every run is a real `orch submit` of the same LoRA job on the tiny GPT-2 (fp32, batch
4 per process, seq 64) on the built-in `local` host for 1, 2, 4 processes and on two namespaced
sshd nodes (tests/support/netns.py, needs root) for 2x2; throughput is the mean of the trainer's own
`tokens_per_s` over the logged steps after the first 5; efficiency = tokens/s / (processes x the
1-process tokens/s); every process runs 1 thread.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import trainer as bench  # noqa: E402  (bench/trainer.py: workers, run_ours, helpers)

IMPLS = {"bare": "bare DDP loop", "ours-pad": "remote_payload.train", "hf": "HF Trainer"}
LAYOUTS = ("1x1", "2x1")


def ddp_table(a: argparse.Namespace) -> None:
    """The side-by-side DDP scaling table (see the module docstring)."""
    assets = a.assets.resolve()
    bench.build_assets(assets)
    cells = [(mode, impl, lay) for mode in ("full", "lora") for impl in IMPLS for lay in LAYOUTS]
    speed: dict[tuple[str, str, str], list[float]] = {c: [] for c in cells}
    print(f"# DDP scaling on CPU, 1x1 -> 2x1\n\n{bench.header(a.repo.resolve())}.\nGPT-2 4x256 random init, text rows "
          f"of exactly {bench.TEXT_SEQ} tokens (no padding), batch {bench.BATCH}/process, fp32, fused AdamW, clip 1.0, "
          f"{a.steps} steps ({a.warmup} warm-up), median (min–max) of {a.repeat} interleaved rounds.\n", flush=True)
    with tempfile.TemporaryDirectory(prefix="orch-bench-scaling-") as tmp:
        for rnd, order in enumerate(bench.rotations(cells, a.repeat)):
            for mode, impl, lay in order:
                res = bench.run_impl(impl, assets, "text", mode, lay, a.steps, a.warmup, Path(tmp), a.repo.resolve())
                speed[mode, impl, lay].append(res["tokens_per_s"])
                print(f"round {rnd + 1}/{a.repeat} {mode} {impl} {lay}: {res['tokens_per_s']:,.0f} tok/s, "
                      f"{res['wall_s']:.0f} s, load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    print("| mode | implementation | tok/s 1x1 | tok/s 2x1 | speed-up 2x1/1x1 | scaling vs bare |\n|---|---|---|---|---|---|")
    for mode in ("full", "lora"):
        ups = {impl: [two / one for one, two in zip(speed[mode, impl, "1x1"], speed[mode, impl, "2x1"])] for impl in IMPLS}
        for impl, name in IMPLS.items():
            rel = [u / b for u, b in zip(ups[impl], ups["bare"])]
            print(f"| {mode} | {name} | {bench.spread(speed[mode, impl, '1x1'])} | {bench.spread(speed[mode, impl, '2x1'])} | "
                  f"{bench.spread(ups[impl], '{:.2f}')} | {'—' if impl == 'bare' else bench.spread(rel, '{:.2f}')} |")
    print(f"\nLoad avg {'/'.join(f'{x:.2f}' for x in os.getloadavg())} at end. Speed-ups and 'vs bare' are per round "
          "(runs of one round are minutes apart at most), then median (min–max). HF Trainer runs with its defaults "
          "(DDP find_unused_parameters=True); the bare loop and ours with find_unused_parameters=False.")


def orch(home: Path, cwd: Path, repo: Path, *args: str) -> str:
    env = dict(os.environ, ORCH_HOME=str(home), HF_HUB_OFFLINE="1", PYTHONPATH=str(repo))
    proc = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"orch {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout


def submit_run(home: Path, work: Path, repo: Path, hosts: list[str], nproc: int, steps: int, roots: dict[str, Path]) -> float:
    """One `orch submit --follow` of the LoRA job; the mean tokens/s of its logged steps after the 5th."""
    spec = work / f"scale-{len(hosts)}x{nproc}.yaml"
    spec.write_text(json.dumps({
        "name": f"scale-{len(hosts)}x{nproc}", "hosts": hosts, "workspace": {"path": "ws"},
        "launch": {"nproc_per_node": nproc}, "env": {"OMP_NUM_THREADS": "1"},
        "train": {"model": "assets/tiny-gpt2", "finetune": "lora", "lora": {"target_modules": ["c_attn"]},
                  "data": {"train": "assets/data/train.jsonl", "max_length": 64}, "precision": "fp32",
                  "batch_size": 4, "max_steps": steps, "log_every": 1, "eval_every": 100000, "save_every": 100000},
    }))
    result = json.loads(orch(home, work, repo, "submit", str(spec), "--follow", "--json"))
    if result["state"] != "succeeded":
        raise SystemExit(f"{spec.name}: {result}")
    for root in roots.values():
        metrics = root / "jobs" / result["job_id"] / "metrics.jsonl"
        if metrics.exists():
            rows = [json.loads(line) for line in metrics.read_text().splitlines()]
            speeds = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r and r.get("step", 0) > 5]
            return statistics.fmean(speeds)
    raise SystemExit(f"{spec.name}: no metrics.jsonl found")


def submit_table(a: argparse.Namespace) -> None:
    """The orch submit table (see the module docstring)."""
    repo = a.repo.resolve()
    sys.path[:0] = [str(repo), str(repo / "tools")]
    from make_tiny_assets import make_tiny_assets

    work = Path(tempfile.mkdtemp(prefix="orch-scaling-"))
    home = work / "home"
    make_tiny_assets(work / "ws" / "assets")
    roots = {"local": home / "local"}
    rows = [(f"1 node × {n}", n, submit_run(home, work, repo, ["local"], n, a.steps, roots)) for n in (1, 2, 4)]
    if os.geteuid() == 0 and shutil.which("ip"):
        from tests.support.netns import start_cluster

        cluster = start_cluster(work / "cluster")
        try:
            names = []
            for node in cluster.nodes:
                roots[node.name] = work / "remote" / node.name
                orch(home, work, repo, "hosts", "add", node.name, "--ssh", f"ssh root@{node.address}", "--identity",
                     str(cluster.client_key), "--root", str(roots[node.name]), "--python", sys.executable, "--trust")
                names.append(node.name)
            rows.append(("2 nodes × 2 (netns)", 4, submit_run(home, work, repo, names, 2, a.steps, roots)))
        finally:
            cluster.teardown()
    base = rows[0][2]
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPU cores, tiny GPT-2 LoRA, fp32, batch 4/process, seq 64, "
          f"{a.steps} steps\n")
    print("| layout | processes | tokens/s | speed-up | efficiency |\n|---|---|---|---|---|")
    for name, procs, speed in rows:
        print(f"| {name} | {procs} | {speed:,.0f} | {speed / base:.2f}× | {speed / base / procs:.0%} |")
    shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--submit", action="store_true", help="the orch submit table instead (1/2/4 processes, netns)")
    parser.add_argument("--steps", type=int, help="steps per run (default 30; 40 with --submit)")
    parser.add_argument("--warmup", type=int, default=10, help="steps before the timed window (>= 1)")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds; cells are medians (min–max)")
    parser.add_argument("--repo", type=Path, default=BENCH.parent, help="the checkout whose remote_payload (and orch) runs")
    parser.add_argument("--assets", type=Path, default=Path(tempfile.gettempdir()) / "orch-bench-trainer-assets")
    a = parser.parse_args()
    a.steps = a.steps or (40 if a.submit else 30)
    if not a.submit and not 1 <= a.warmup < a.steps:
        sys.exit("need 1 <= --warmup < --steps")
    (submit_table if a.submit else ddp_table)(a)


if __name__ == "__main__":
    main()

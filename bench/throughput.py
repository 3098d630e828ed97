"""orch's throughput rows: first sync vs the link's floor, fetch vs rsync, a no-change refetch vs one round trip.

On loopback and through ``bench/latency_proxy.py`` (default 20 ms each way = 40 ms RTT,
100 Mbit/s each way), against one real loopback sshd (``tests/support/sshd.py``). orch runs as a user
runs it: ``python -m orchestrator ...`` in a subprocess, its own ``ORCH_HOME``, the host added
once with ``orch hosts add NAME --ssh "ssh -p PORT root@127.0.0.1" --identity KEY --root DIR
--trust``, and one untimed submit first (payload install; it also warms whatever orch keeps
between commands: orch may keep a per-host connection holder in the background,
``orchestrator/holder/daemon.py`` as of 2026-11-30, which exits when idle for ``ORCH_HOLD_IDLE_S`` or
once ``ORCH_HOME`` — the bench's temp dir — is gone). orch is timed until the command returns.

- **(a) first sync**: ``orch submit job.yaml --json`` (job: ``python -c pass``) of a fresh
  checkout (a hard-linked copy of the workspace under a new path: a new server folder) of
  2000 × 10 KiB + one 50 MB file (random bytes, fixed seed; ~70 MB), until the command returned —
  against the link's floor, workspace bytes ÷ bandwidth (through the proxy only; goal ≤ 1.05 ×
  floor), and against ``rsync -a`` of the same into a new dir through a warm ControlMaster.
  "orch send s" is the data path alone: from the plan to the server's answer that it holds and
  staged every file (``ORCH_TRACE``'s ``plan`` and ``send`` marks: tar, sha256, the holder,
  paramiko, the server's receive), where "orch s" also holds the CLI's start, the spec's checks,
  ``hello`` and the job's launch, which rsync does not do. On loopback, where there is no floor,
  the goal is the data path at ≥ 0.9 × rsync's throughput (send ÷ rsync time ≤ 1.11; issue 26).
- **(b) fetch**: ``orch fetch JOB --dest NEW`` of a job that wrote one 200 MB file
  (``outputs/big.bin``, ``outputs: [outputs/]``), against ``rsync -a root@127.0.0.1:FILE NEW/``
  over a fresh ssh and through the warm ControlMaster. Goal: orch ≥ 0.9 × rsync's throughput
  (orch ÷ rsync time ≤ 1.11). One untimed fetch first (the server's manifest, the page cache);
  every timed one goes into a fresh local destination.
- **(c) no-change refetch**: ``orch fetch JOB --dest SAME`` right after (b), nothing new,
  against one round trip (2 × delay, proxy only; goal ≤ 1 RTT) and ``ssh host true`` through
  the ControlMaster (and over a fresh connection).

Nothing a round made is deleted before the bench ends (with its temp folder): on ext4 a mass deletion makes
the next minute's file creations slow — the inode allocator skips recently deleted inodes,
measured at ~350 µs of kernel CPU per created file right after one — which would charge
whichever tool ran next. On this machine even a quiet disk carries that history (its ``/tmp`` has
seen millions of test files come and go), so ``TMPDIR=/dev/shm`` puts every tool's files on a
tmpfs: the tools are measured, not the disk's allocator. RESULTS.md says which was used.

Every cell is the median of ``--repeat`` rounds; in each round the tools alternate (order
rotated each round). ``orch --help`` (python start + what the CLI loads for it: a floor for any
orch command) is printed in the header.

    .venv/bin/python bench/throughput.py [--repeat 3] [--delay-ms 20] [--mbit 100]
    TMPDIR=/dev/shm .venv/bin/python bench/throughput.py --repeat 3
    .venv/bin/python bench/throughput.py --repeat 1 --files 50 --big-mb 1 --fetch-mb 5   # quick check
    (``--orch-src DIR`` runs the orch of another source tree, e.g. ``git archive HEAD`` unpacked)
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import common
from common import ControlMaster, Orch, machine, median, ssh_argv, table

DEST = "root@127.0.0.1"


def spec(orch: Orch, name: str, host: str, ws: Path, command: list[str], outputs: str = "[]") -> Path:
    path = orch.cwd / f"{name}.yaml"
    path.write_text(f"name: {name}\nhosts: [{host}]\nworkspace: {{path: {ws.name}}}\n"
                    f"launch:\n  nproc_per_node: 1\n  command: {json.dumps(command)}\noutputs: {outputs}\n")
    return path


def run_job(orch: Orch, root: Path, path: Path) -> tuple[float, str]:
    """``orch submit``: (seconds until it returned, job id); waits until the job succeeded."""
    seconds, job_id = orch.submit(path)
    state = common.wait_job(root, job_id, timeout=600)
    if state != "succeeded":
        print(f"orch job {job_id} ended {state}", file=sys.stderr)
        raise SystemExit(1)
    return seconds, job_id


def rsync(ssh: list[str], src: str, dest: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(["rsync", "-a", "-e", shlex.join(ssh), src, dest], check=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0


def ssh_true(ssh: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([*ssh, DEST, "true"], check=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0


def fetched_size(dest: Path) -> int:
    return sum(p.stat().st_size for p in dest.rglob("big.bin"))


def main() -> None:
    ap = common.link_parser(__doc__.split("\n\n")[0])
    common.workspace_args(ap, "the workspace's big file")
    ap.add_argument("--fetch-mb", type=int, default=200, help="size of the job's output file in MB (default 200)")
    args = ap.parse_args()
    rtt = 2 * args.delay_ms / 1000
    with common.sshd_and_proxy("orch-bench-tput-", args) as (tmp, server, proxy):
        key = server.client_key
        laptop = tmp / "laptop"
        master = laptop / "master"
        common.make_workspace(master, args.files, args.file_kib << 10, int(args.big_mb * 1e6))
        total = sum(p.stat().st_size for p in master.rglob("*") if p.is_file())
        floor = total * 8 / (args.mbit * 1e6)
        small_ws = laptop / "small"
        small_ws.mkdir()
        (small_ws / "README").write_text("the fetch job's workspace\n")
        orch = Orch(tmp / "home", laptop, args.orch_src)
        helps = [orch.timed("--help")[0] for _ in range(max(args.repeat, 1))]
        fetch_bytes = args.fetch_mb * 1_000_000
        writer = ("import os, random\nos.makedirs('outputs', exist_ok=True)\nr = random.Random(7)\n"
                  f"with open('outputs/big.bin', 'wb') as f:\n    for _ in range({args.fetch_mb}):\n"
                  "        f.write(r.randbytes(1000000))\n")
        print(f"# orch throughput: first sync, fetch, no-change refetch — {machine()}")
        print(f"workspace {total / 1e6:.1f} MB ({args.files} × {args.file_kib} KiB + 1 × {args.big_mb:g} MB); "
              f"fetched file {args.fetch_mb} MB; median of {args.repeat} interleaved rounds; proxy: "
              f"{args.delay_ms:g} ms each way ({rtt * 1000:g} ms RTT), {args.mbit:g} Mbit/s each way; "
              f"`orch --help` (python start + what the CLI loads for it): {median(helps):.2f} s\n")
        rows_a, rows_b, rows_c = [], [], []
        for label, port in (("loopback", server.port), ("proxy", proxy.port)):
            host, root = f"b-{label}", tmp / f"remote-{label}"
            orch.add_host(host, port, key, root)
            run_job(orch, root, spec(orch, f"warm-{label}", host, small_ws, ["python", "-c", "pass"]))  # untimed
            cm = ControlMaster(port, key)
            cm.open()
            argv = {"fresh": ssh_argv(port, key), "cm": cm.argv}
            t: dict[str, list[float]] = {}
            wire: dict[str, list[int]] = {}
            try:
                # (b, c) setup: the job writes the big file; one untimed fetch.
                _, job = run_job(orch, root, spec(orch, f"big-{label}", host, small_ws,
                                                  ["python", "-c", writer], "[outputs/]"))
                remote_file = next((root / "jobs" / job).rglob("big.bin"))
                orch.run("fetch", job, "--dest", str(tmp / "fetch-warm"))
                shutil.rmtree(tmp / "fetch-warm")
                for r in range(args.repeat):
                    # (a) first sync: a new checkout, so a new server folder for orch; a new dir for rsync.
                    ws = laptop / f"ws-{label}-{r}"
                    subprocess.run(["cp", "-al", str(master), str(ws)], check=True)
                    anchor_dir = tmp / f"rsync-{label}-{r}"
                    for tool in (("orch", "rsync") if r % 2 == 0 else ("rsync", "orch")):
                        w0 = sum(proxy.counters())
                        if tool == "orch":
                            with orch.traced(tmp / "trace.txt") as traced:
                                s = run_job(orch, root, spec(orch, f"a-{label}-{r}", host, ws,
                                                             ["python", "-c", "pass"]))[0]
                            sent = [p for p in traced if "send" in p and "plan" in p]
                            t.setdefault("a-send", []).append((sent[0]["send"] - sent[0]["plan"]) / 1000)
                        else:
                            s = rsync(cm.argv, f"{ws}/", f"{DEST}:{anchor_dir}/")
                        t.setdefault(f"a-{tool}", []).append(s)
                        wire.setdefault(tool, []).append(sum(proxy.counters()) - w0)
                        if label == "proxy" and wire[tool][-1] < 0.9 * total:
                            print(f"warning: {tool}'s first sync moved {wire[tool][-1] / 1e6:.1f} MB of a "
                                  f"{total / 1e6:.1f} MB workspace: not a cold first sync", file=sys.stderr)
                    # (b) fetch, each into a fresh destination; (c) orch's refetch right after its fetch.
                    tools = ("orch", "fresh", "cm")
                    for tool in tools[r % 3:] + tools[:r % 3]:
                        dest = tmp / f"fetch-{tool}-{label}-{r}"
                        dest.mkdir()
                        if tool == "orch":
                            s = orch.timed("fetch", job, "--dest", str(dest))[0]
                            again, proc = orch.timed("fetch", job, "--dest", str(dest))
                            if " 0 fetched" not in proc.stdout:
                                print(f"warning: the refetch moved something: {proc.stdout.strip()}", file=sys.stderr)
                            t.setdefault("c-orch", []).append(again)
                        else:
                            s = rsync(argv[tool], f"{DEST}:{remote_file}", f"{dest}/")
                        if fetched_size(dest) != fetch_bytes:
                            print(f"{tool} fetched {fetched_size(dest)} bytes, not {fetch_bytes}", file=sys.stderr)
                            raise SystemExit(1)
                        t.setdefault(f"b-{tool}", []).append(s)
                    for tool in ("cm", "fresh"):
                        t.setdefault(f"c-{tool}", []).append(ssh_true(argv[tool]))
            finally:
                cm.close()
            m = {k: median(v) for k, v in t.items()}
            fl = floor if label == "proxy" else None
            path_ratio = m["a-send"] / m["a-rsync"]
            rows_a.append((label, f"{total / 1e6:.1f}", f"{fl:.2f}" if fl else "—", m["a-orch"], m["a-send"],
                           m["a-rsync"], f"{m['a-orch'] / fl:.2f}" if fl else "—",
                           f"{m['a-rsync'] / fl:.2f}" if fl else "—", f"{m['a-orch'] / m['a-rsync']:.2f}",
                           f"{path_ratio:.2f}",
                           (f"orch/floor ≤ 1.05: {'met' if m['a-orch'] / fl <= 1.05 else 'not met'}" if fl else
                            f"send/rsync CM ≤ 1.11: {'met' if path_ratio <= 1 / 0.9 else 'not met'}"),
                           f"{median(wire['orch']) / 1e6:.1f} / {median(wire['rsync']) / 1e6:.1f}" if fl else "—"))
            mb = fetch_bytes / 1e6
            rows_b.append((label, m["b-orch"], m["b-fresh"], m["b-cm"], f"{mb / m['b-orch']:.0f}",
                           f"{mb / m['b-fresh']:.0f}", f"{mb / m['b-cm']:.0f}", f"{m['b-orch'] / m['b-fresh']:.2f}",
                           f"{m['b-orch'] / m['b-cm']:.2f}",
                           f"≤ 1.11: {'met' if m['b-orch'] / m['b-fresh'] <= 1 / 0.9 else 'not met'}"))
            rows_c.append((label, m["c-orch"], f"{rtt:.3f}" if fl else "—", m["c-cm"], m["c-fresh"],
                           f"{m['c-orch'] / rtt:.1f}" if fl else "—", f"{m['c-orch'] / m['c-cm']:.1f}",
                           (f"≤ 1 RTT: {'met' if m['c-orch'] <= rtt else 'not met'}" if fl else "—")))

        print("(a) first sync of the workspace (`orch submit` of a fresh checkout, until it returned) vs the "
              "link's floor (bytes ÷ bandwidth):\n")
        print(table(["link", "workspace MB", "floor s", "orch s", "orch send s", "rsync CM s", "orch/floor",
                     "rsync/floor", "orch/rsync CM", "send/rsync CM", "goal", "wire MB orch / rsync"], rows_a))
        print(f"\n(b) fetch of one {args.fetch_mb} MB output file into a fresh destination:\n")
        print(table(["link", "orch s", "rsync fresh s", "rsync CM s", "orch MB/s", "rsync fresh MB/s",
                     "rsync CM MB/s", "orch/rsync fresh", "orch/rsync CM", "goal orch/rsync fresh"], rows_b))
        print("\n(c) no-change refetch (`orch fetch JOB` again, nothing new) vs one round trip and `ssh host true`:\n")
        print(table(["link", "orch s", "1 RTT s", "ssh CM true s", "ssh fresh true s", "orch/RTT",
                     "orch/ssh CM true", "goal"], rows_c))


if __name__ == "__main__":
    main()

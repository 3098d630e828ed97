"""The fast loop: ``orch submit`` (sync + launch) vs rsync + ssh 'setsid -f python3 job.py'.

Measured: the time until the command returns for three rows — first submit (a fresh server
folder), no-change resubmit, one file changed (one 10 KiB file rewritten) — of a workspace of
2000 × 10 KiB files + one 50 MB file (random bytes, fixed seed) plus ``job.py``, a tiny job
that writes a marker file. On loopback and through ``bench/latency_proxy.py`` (default 20 ms
each way = 40 ms RTT, 100 Mbit/s each way), against one real loopback sshd (``tests/support/sshd.py``).

Against (same sync + a detached launch):

- **rsync+ssh fresh**: ``rsync -a -e "ssh -p PORT -i KEY ..." WS/ root@127.0.0.1:DIR/`` then
  ``ssh ... 'cd DIR && setsid -f python3 job.py MARKER >log 2>&1 < /dev/null'``, each a new
  connection;
- **rsync+ssh ControlMaster**: the same two commands through a warm OpenSSH ControlMaster
  (``ControlMaster=auto``, ``ControlPath`` in a short private temp dir, ``ControlPersist=600``,
  the master opened before any timing);
- **orch**: ``python -m orchestrator submit job.yaml --json`` in a subprocess, its own
  ``ORCH_HOME``, host added once with ``orch hosts add NAME --ssh "ssh -p PORT root@127.0.0.1"
  --identity KEY --root DIR --trust``; job ``python job.py MARKER`` (one process). One untimed
  submit of a tiny workspace runs before the timed ones: it installs orch's server payload and
  warms whatever orch keeps between commands. orch may keep a per-host connection holder in the
  background (``orchestrator/holder/daemon.py`` as of 2026-11-30: one warm SSH connection per host,
  exiting after ``ORCH_HOLD_IDLE_S``, default 600 s, idle or once ``ORCH_HOME`` is gone — the
  bench's temp dir, removed at the end); if it does, the timed runs use it, as a user's next
  command would, just as the ControlMaster anchor uses its master. orch is timed until the
  command returns; its stderr progress lines are timestamped as they come (a phase breakdown).

"first submit" uses a fresh server folder for every tool on every run: the anchors rsync into a
new remote dir, orch submits a new checkout (a hard-linked copy of the workspace under a new
path, which orch maps to a new server workspace folder). Each round (first, no-change,
one file changed) uses its own checkout; between runs (untimed) the bench waits for each job's
marker and for orch's job to be terminal. Nothing a run made is deleted before the bench ends
(with its temp folder), for the reason ``bench/throughput.py`` gives: a mass deletion on ext4
slows the next minute's file creations. Every cell is the median of ``--repeat`` rounds;
within a round the three tools alternate (order rotated each round). Ratios: orch ÷
ControlMaster and orch ÷ fresh; goal (the issue's): first submit ≤ 1.05 × ControlMaster,
no-change and one-file ≤ 1.0 × ControlMaster.

**Back-to-back** (``--back-to-back``, the edit–run–fail–fix loop, issue 26): each round, each tool
in turn (order rotated) runs its three rows at once one after the other on a fresh checkout of its
own — first submit to a fresh server folder, at once the no-change resubmit, at once one file
changed — and only then are its jobs' markers waited for; nothing else runs between them. orch's
commands run with ``ORCH_TRACE`` into a file (``orchestrator/trace.py``) and the median ms at which
each phase came is printed per row. ``--load``: the same beside one CPU-bound process per core.
orch runs byte-compiled (a private ``PYTHONPYCACHEPREFIX``; ``PYTHONDONTWRITEBYTECODE`` dropped), as
an installed orch is; the untimed warm-up submit fills that cache.

Where the temp folder lives (both laptop and server sides, every tool) is ``TMPDIR``'s: on this
machine's ext4, creating a file costs ~350 µs of kernel CPU after the disk's history of mass
deletions (``bench/throughput.py``), which swamps what the tools do; ``TMPDIR=/dev/shm`` (a tmpfs)
measures the tools. RESULTS.md says which was used.

    .venv/bin/python bench/loop.py [--repeat 3] [--delay-ms 20] [--mbit 100]
    TMPDIR=/dev/shm .venv/bin/python bench/loop.py --back-to-back [--repeat 3]
    .venv/bin/python bench/loop.py --back-to-back [--load] [--repeat 5]
    .venv/bin/python bench/loop.py --repeat 1 --files 50 --big-mb 1      # quick check
    (``--orch-src DIR`` runs the orch of another source tree, e.g. ``git archive HEAD`` unpacked)
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
from common import ControlMaster, Orch, machine, median, ssh_argv, table

JOB = "import sys, time\nopen(sys.argv[1], 'w').write(repr(time.time()))\n"
TOOLS = ("fresh", "cm", "orch")
ROWS = ("first submit", "no-change resubmit", "one file changed")
GOAL = {"first submit": 1.05, "no-change resubmit": 1.0, "one file changed": 1.0}
DEST = "root@127.0.0.1"


def anchor_submit(ssh: list[str], ws: Path, dest: Path, marker: Path) -> float:
    """rsync the workspace into ``dest`` and launch the job detached; seconds until ssh returned."""
    launch = f"cd {shlex.quote(str(dest))} && setsid -f python3 job.py {shlex.quote(str(marker))} >log 2>&1 < /dev/null"
    t0 = time.perf_counter()
    subprocess.run(["rsync", "-a", "-e", shlex.join(ssh), f"{ws}/", f"{DEST}:{dest}/"], check=True,
                   stdin=subprocess.DEVNULL)
    subprocess.run([*ssh, DEST, launch], check=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0


def orch_submit(orch: Orch, host: str, root: Path, ws: Path, marker: Path) -> tuple[float, dict[str, float]]:
    """``orch submit`` of ``ws`` (job writes ``marker``): seconds until it returned and when each
    progress line came; the job is left to end and its folder removed."""
    seconds, job_id = orch.submit(write_spec(orch, host, ws, marker))
    phases = orch.phases()
    settle(root, job_id)
    return seconds, phases


def settle(root: Path, job_id: str) -> None:
    """Wait for orch's job to end (succeeded; untimed)."""
    state = common.wait_job(root, job_id)
    if state != "succeeded":
        print(f"orch job {job_id} ended {state}", file=sys.stderr)
        raise SystemExit(1)


def write_spec(orch: Orch, host: str, ws: Path, marker: Path) -> Path:
    spec = orch.cwd / f"job-{ws.name}.yaml"
    spec.write_text(f"name: loop-{host}\nhosts: [{host}]\nworkspace: {{path: {ws.name}}}\n"
                    f"launch:\n  nproc_per_node: 1\n  command: {json.dumps(['python', 'job.py', str(marker)])}\n")
    return spec


def back_to_back(args, orch: Orch, label: str, host: str, root: Path, argv: dict[str, list[str]], master: Path,
                 small: list[Path], laptop: Path, anchors: Path, marker) -> tuple[dict, dict]:
    """The back-to-back rounds on one link: {(row, tool): [seconds]}, {row: [orch's phases]}."""
    times: dict[tuple[str, str], list[float]] = {}
    phases: dict[str, list[dict[str, float]]] = {}
    trace_file = orch.cwd.parent / "trace.txt"
    for r in range(args.repeat):
        for tool in TOOLS[r % 3:] + TOOLS[:r % 3]:
            ws = laptop / f"ws-{label}-{r}-{tool}"
            subprocess.run(["cp", "-al", str(master), str(ws)], check=True)  # a fresh checkout, same bytes
            dest = anchors / f"{tool}-{label}-{r}"
            waits = []
            for row in ROWS:
                if row == "one file changed":
                    rewrite_one(ws / small[(r * 37) % len(small)], args.file_kib << 10)
                m = marker()
                if tool == "orch":
                    with orch.traced(trace_file) as traced:
                        s, job_id = orch.submit(write_spec(orch, host, ws, m))
                    phases.setdefault(row, []).extend(traced)
                    waits.append(job_id)
                else:
                    s = anchor_submit(argv[tool], ws, dest, m)
                times.setdefault((row, tool), []).append(s)
                waits.append(m)
            for w in waits:  # untimed: every job of the sequence did run
                if isinstance(w, Path):
                    common.wait_for(w.exists, timeout=60, every=0.01)
                    w.unlink()
                else:
                    settle(root, w)
    return times, phases


def rewrite_one(path: Path, size: int) -> None:
    """New content for one file, saved as editors do (new file, renamed over): the hard-linked
    master copy stays as it was."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(os.urandom(size))
    os.replace(tmp, path)


def main() -> None:
    ap = common.link_parser(__doc__.split("\n\n")[0])
    common.workspace_args(ap, "the big file")
    ap.add_argument("--back-to-back", action="store_true", help="each tool's three rows at once, one after the other")
    ap.add_argument("--load", action="store_true", help="beside one CPU-bound process per core")
    args = ap.parse_args()
    with common.sshd_and_proxy("orch-bench-loop-", args) as (tmp, server, proxy), common.cpu_load(args.load):
        key = server.client_key
        laptop = tmp / "laptop"
        master = laptop / "master"
        small = [p.relative_to(master) for p in common.make_workspace(
            master, args.files, args.file_kib << 10, int(args.big_mb * 1e6))]
        (master / "job.py").write_text(JOB)
        total = sum(p.stat().st_size for p in master.rglob("*") if p.is_file())
        warm_ws = laptop / "warm"
        warm_ws.mkdir()
        (warm_ws / "job.py").write_text(JOB)
        orch = Orch(tmp / "home", laptop, args.orch_src)
        markers = tmp / "markers"
        markers.mkdir()
        anchors = tmp / "anchors"
        anchors.mkdir()
        print(f"# the fast loop{' back to back' if args.back_to_back else ''}{', loaded' if args.load else ''}: "
              f"orch submit vs rsync + ssh setsid — {machine()}")
        print(f"workspace: {args.files} × {args.file_kib} KiB + 1 × {args.big_mb:g} MB + job.py "
              f"({total / 1e6:.1f} MB); median of {args.repeat} interleaved rounds; proxy: "
              f"{args.delay_ms:g} ms each way ({2 * args.delay_ms:g} ms RTT), {args.mbit:g} Mbit/s each way\n")
        rows, wire, progress = [], [], []
        words: dict[str, None] = {}  # orch's progress words, in the order they first came
        n = 0

        def marker() -> Path:
            nonlocal n
            n += 1
            return markers / f"m{n}"

        for label, port in (("loopback", server.port), ("proxy", proxy.port)):
            host, root = f"b-{label}", tmp / f"remote-{label}"
            orch.add_host(host, port, key, root)
            m = marker()
            orch_submit(orch, host, root, warm_ws, m)  # untimed: payload install, warm connection if any
            cm = ControlMaster(port, key)
            cm.open()
            argv = {"fresh": ssh_argv(port, key), "cm": cm.argv}
            times: dict[tuple[str, str], list[float]] = {}
            nbytes: dict[tuple[str, str], list[int]] = {}
            phases: dict[str, list[dict[str, float]]] = {}
            try:
                if args.back_to_back:
                    times, phases = back_to_back(args, orch, label, host, root, argv, master, small, laptop, anchors,
                                                 marker)
                for r in range(args.repeat if not args.back_to_back else 0):
                    ws = laptop / f"ws-{label}-{r}"
                    subprocess.run(["cp", "-al", str(master), str(ws)], check=True)  # a new checkout, same bytes
                    order = TOOLS[r % 3:] + TOOLS[:r % 3]
                    for row in ROWS:
                        if row == "one file changed":
                            rewrite_one(ws / small[(r * 37) % len(small)], args.file_kib << 10)
                        for tool in order:
                            m = marker()
                            wire0 = sum(proxy.counters())
                            if tool == "orch":
                                s, ph = orch_submit(orch, host, root, ws, m)
                                phases.setdefault(row, []).append(ph)
                            else:
                                s = anchor_submit(argv[tool], ws, anchors / f"{tool}-{label}-{r}", m)
                            nbytes.setdefault((row, tool), []).append(sum(proxy.counters()) - wire0)
                            if label == "proxy" and row == "first submit" and nbytes[(row, tool)][-1] < 0.9 * total:
                                print(f"warning: {tool}'s first submit moved {nbytes[(row, tool)][-1] / 1e6:.1f} MB "
                                      f"of a {total / 1e6:.1f} MB workspace: not a cold first submit", file=sys.stderr)
                            times.setdefault((row, tool), []).append(s)
                            common.wait_for(m.exists, timeout=60, every=0.01)  # untimed: the job did run
                            m.unlink()
            finally:
                cm.close()
            for row in ROWS:
                fresh, cmt, o = (median(times[(row, t)]) for t in TOOLS)
                goal = GOAL[row]
                rows.append((f"{row} ({label})", fresh, cmt, o, f"{o / cmt:.2f}", f"{o / fresh:.2f}",
                             f"≤ {goal:.2f}: {'met' if o / cmt <= goal else 'not met'}"))
                seen = [k for ph in phases[row] for k in ph]
                for k in dict.fromkeys(seen):
                    words.setdefault(k, None)
                progress.append((f"{row} ({label})", {k: median([ph[k] for ph in phases[row] if k in ph])
                                                      for k in dict.fromkeys(seen)}, o))
                if label == "proxy" and not args.back_to_back:
                    wire.append((row, *(f"{median(nbytes[(row, t)]) / 1e6:.3f}" for t in TOOLS)))

        print(table(["row", "rsync+ssh fresh s", "rsync+ssh ControlMaster s", "orch s", "orch/ControlMaster",
                     "orch/fresh", "goal orch/ControlMaster"], rows))
        if args.back_to_back:
            print("\norch's ORCH_TRACE phases: ms since the command started at which each first came (median):\n")
            print(table(["row", *words], [(r, *(f"{ph[w]:.0f}" if w in ph else "—" for w in words))
                                          for r, ph, _ in progress]))
            print(f"\nload avg at end {os.getloadavg()[0]:.2f}")
            return
        print("\nbytes on the wire through the proxy (both directions, MB, median):\n")
        print(table(["row", "rsync+ssh fresh", "rsync+ssh ControlMaster", "orch"], wire))
        print("\norch seen from outside: seconds from the start of `orch submit` at which each of its stderr "
              "progress lines first came (by first word; median), and when it returned:\n")
        print(table(["row", *(f"'{w}'" for w in words), "returned"],
                    [(r, *(ph.get(w, "—") for w in words), o) for r, ph, o in progress]))


if __name__ == "__main__":
    main()

"""orch's move rows: ``orch resume JOB --on HOST`` of a stopped job, through the laptop and direct, vs tar and rsync.

On loopback and through ``bench/latency_proxy.py`` (default 20 ms each way = 40 ms RTT,
100 Mbit/s each way), against one real loopback sshd (``tests/support/sshd.py``). Two inventory hosts
on it with different roots, ``a`` and ``b`` (``orch hosts add NAME --ssh "ssh -p PORT
root@127.0.0.1" --identity KEY --root DIR --python PY --trust``), and the same two through the
proxy, ``a-far`` and ``b-far`` (same roots, the proxy's port). orch runs as a user runs it:
``python -m orchestrator ...`` in a subprocess with its own ``ORCH_HOME``; one untimed submit
to every host first (payload install, kept-warm connections) and one untimed move of a small
job each way per link (whatever a first move loads once).

The job: an own script (``launch.command``) that writes one ``--size-mb`` file of random bytes
(default 200 MB) as ``outputs/big.bin`` under its working directory and exits (it writes nothing
when the file is already there, as a script that resumes from its own files does: the moved job
starts on the target, finds the file and ends). Every timed move is of a fresh job submitted
and waited for (succeeded) untimed, on ``a`` (``a-far``), moved to ``b`` (``b-far``); orch is
timed until the command returned, the moved job's start on the target included (``adopt``
plans and launches it; the job itself runs after the command returned).

- **through the laptop**: ``orch resume JOB --on b --through-laptop`` vs ``ssh a 'tar -C JOBDIR
  -cf - .' | ssh b 'mkdir -p NEW && tar -C NEW -xf -'`` through two warm ControlMasters (the same
  bytes streamed through the laptop, the whole job folder).
- **direct**: ``orch resume JOB --on b --direct`` (b pulls from a over SSH with a temporary key
  of its own in root's ``~/.ssh/authorized_keys``) vs ``ssh b "rsync -a -e 'ssh -p PORT -i KEY
  ...' root@127.0.0.1:JOBDIR/ NEW/"`` (the ssh to b through its warm ControlMaster; b's own ssh
  to a is a fresh connection, as orch's is). On loopback both servers are this machine; through
  the proxy, b reaches a through the proxy's port (the server-to-server link is the same slow link).

Every cell is the median of ``--repeat`` rounds; in each round the four tools alternate (order
rotated each round). Each moved copy is checked (the big file's size on b; the moved job
succeeded there; no staging folder left). Root's real ``~/.ssh/authorized_keys`` (where the
direct path's temporary key goes) is compared byte for byte, with its mode and owner, before
and after every direct move and at the end.

    .venv/bin/python bench/move.py [--repeat 3] [--size-mb 200] [--delay-ms 20] [--mbit 100]
    .venv/bin/python bench/move.py --quick   # smoke run: 5 MB, 1 round, orch's progress lines
    (``--orch-src DIR`` runs the orch of another source tree, e.g. ``git archive HEAD`` unpacked)
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import common
from common import REPO, ControlMaster, Orch, machine, median, ssh_argv, table

DEST = "root@127.0.0.1"
WRITER = ("import os, random, sys\n"
          "if not os.path.exists('outputs/big.bin'):\n"
          "    os.makedirs('outputs', exist_ok=True)\n"
          "    r = random.Random(7)\n"
          "    with open('outputs/big.bin.tmp', 'wb') as f:\n"
          "        for _ in range(int(sys.argv[1])):\n"
          "            f.write(r.randbytes(1000000))\n"
          "    os.replace('outputs/big.bin.tmp', 'outputs/big.bin')\n")
MOVED = re.compile(r"moved \S+ to \S+ \(([\d.]+) MB in ([\d.]+) s\)")


def spec(orch: Orch, name: str, host: str, ws: Path, mb: int) -> Path:
    path = orch.cwd / f"{name}.yaml"
    path.write_text(f"name: {name}\nhosts: [{host}]\nworkspace: {{path: {ws.name}}}\n"
                    f"launch:\n  nproc_per_node: 1\n  command: {json.dumps(['python', '-c', WRITER, str(mb)])}\n"
                    "outputs: []\n")
    return path


def alive(pid: object) -> bool:
    """Whether process ``pid`` runs here (a zombie does not)."""
    try:
        return isinstance(pid, int) and "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def run_job(orch: Orch, root: Path, path: Path) -> str:
    """``orch submit`` (untimed), wait until the job succeeded and its supervisor has exited
    (the recorded environment, ``repro/pip-freeze.txt``, lands after a short job's terminal
    state, and ``manifest.json`` is refreshed then: a copy taken before would race it); its id."""
    _, job_id = orch.submit(path)
    settle(root, job_id, "submitted")
    return job_id


def settle(root: Path, job_id: str, what: str) -> None:
    """Wait until the job succeeded on ``root`` and its supervisor has exited (see ``run_job``)."""
    state = common.wait_job(root, job_id, timeout=600)
    if state != "succeeded":
        logs = sorted((root / "jobs" / job_id / "logs").glob("*.log"))
        tail = "\n".join(line for log in logs for line in log.read_text(errors="replace").splitlines()[-10:])
        print(f"orch job {job_id} ({what}) ended {state}; its logs' last lines:\n{tail}", file=sys.stderr)
        raise SystemExit(1)
    status = json.loads((root / "jobs" / job_id / "status.json").read_text())
    common.wait_for(lambda: not alive(status.get("supervisor_pid")), timeout=300, every=0.05)


def big_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("big.bin"))


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


class AuthorizedKeys:
    """Root's real ``~/.ssh/authorized_keys`` (the sshd reads it besides its own file): its
    bytes, mode and owner, to compare with what it was at the start."""

    def __init__(self) -> None:
        self.path = Path(pwd.getpwnam("root").pw_dir) / ".ssh" / "authorized_keys"
        self.start = self.snapshot()

    def snapshot(self) -> tuple[bytes, int, int, int] | None:
        try:
            st = self.path.stat()
            return self.path.read_bytes(), st.st_mode & 0o7777, st.st_uid, st.st_gid
        except FileNotFoundError:
            return None

    def describe(self, snap: tuple[bytes, int, int, int] | None) -> str:
        if snap is None:
            return "absent"
        lines = snap[0].decode("utf-8", "replace").splitlines()
        return f"{len(snap[0])} bytes, {len(lines)} line(s), mode {snap[1]:o}, uid {snap[2]}"

    def check(self, when: str) -> bool:
        now = self.snapshot()
        if now == self.start:
            return True
        ours = [line for line in (now[0] if now else b"").decode("utf-8", "replace").splitlines() if "orch-move" in line]
        print(f"warning: {self.path} changed ({when}): was {self.describe(self.start)}, now {self.describe(now)}"
              + (f"; orch-move keys in it: {ours}" if ours else ""), file=sys.stderr)
        return False


def anchor_laptop(cm_a: ControlMaster, cm_b: ControlMaster, job_dir: Path, new: Path) -> float:
    t0 = time.perf_counter()
    src = subprocess.Popen([*cm_a.argv, DEST, f"tar -C {shlex.quote(str(job_dir))} -cf - ."],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    dst = subprocess.run([*cm_b.argv, DEST, f"mkdir -p {shlex.quote(str(new))} && tar -C {shlex.quote(str(new))} -xf -"],
                         stdin=src.stdout, check=False)
    assert src.stdout is not None
    src.stdout.close()
    if src.wait() != 0 or dst.returncode != 0:
        print(f"the tar | tar anchor failed ({src.returncode}, {dst.returncode})", file=sys.stderr)
        raise SystemExit(1)
    return time.perf_counter() - t0


def anchor_direct(cm_b: ControlMaster, port: int, key: Path, job_dir: Path, new: Path) -> float:
    inner = shlex.join(ssh_argv(port, key))
    remote = f"rsync -a -e {shlex.quote(inner)} {DEST}:{shlex.quote(str(job_dir))}/ {shlex.quote(str(new))}/"
    t0 = time.perf_counter()
    subprocess.run([*cm_b.argv, DEST, remote], check=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = common.link_parser(__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=200, help="size of the job's file in MB (default 200)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 5 MB, 1 round; prints orch's progress lines")
    ap.add_argument("--orch-src", type=Path, default=REPO, help="source tree of the orch to run (default: this checkout)")
    args = ap.parse_args()
    if args.quick:
        args.size_mb, args.repeat = 5, 1
    rtt = 2 * args.delay_ms / 1000
    keys_file = AuthorizedKeys()
    keys_ok = True
    with common.sshd_and_proxy("orch-bench-move-", args) as (tmp, server, proxy):
        key = server.client_key
        laptop = tmp / "laptop"
        ws = laptop / "ws"
        ws.mkdir(parents=True)
        (ws / "README").write_text("the moved job's workspace: its script writes outputs/big.bin\n")
        orch = Orch(tmp / "home", laptop, args.orch_src)
        root_a, root_b = tmp / "remote-a", tmp / "remote-b"
        links = {"loopback": ("a", "b", server.port), "proxy": ("a-far", "b-far", proxy.port)}
        for src, dst, port in links.values():
            orch.add_host(src, port, key, root_a)
            orch.add_host(dst, port, key, root_b)
        print(f"# orch move (resume --on) vs tar | tar and server-to-server rsync — {machine()}")
        t: dict[str, list[float]] = {}
        phase: dict[str, list[float]] = {}
        wire: dict[str, list[int]] = {}
        folder_mb: list[float] = []
        seq = 0
        for label, (src, dst, port) in links.items():
            for host, root in ((src, root_a), (dst, root_b)):  # untimed: payload install, warm connections
                shutil.rmtree(root / "jobs" / run_job(orch, root, spec(orch, f"warm-{host}", host, ws, 0)),
                              ignore_errors=True)
            for way in ("--through-laptop", "--direct"):  # untimed: one small move each way
                job = run_job(orch, root_a, spec(orch, f"warm-move-{label}", src, ws, 1))
                orch.run("resume", job, "--on", dst, way)
                settle(root_b, job, f"moved to {dst}")
                for root in (root_a, root_b):
                    shutil.rmtree(root / "jobs" / job, ignore_errors=True)
            keys_ok &= keys_file.check(f"after the warm-up moves ({label})")
            cm_a, cm_b = ControlMaster(port, key), ControlMaster(port, key)
            cm_a.open()
            cm_b.open()
            try:
                for r in range(args.repeat):
                    tools = [("laptop", "orch"), ("laptop", "anchor"), ("direct", "orch"), ("direct", "anchor")]
                    for way, tool in tools[r % 4:] + tools[:r % 4]:
                        seq += 1
                        job = run_job(orch, root_a, spec(orch, f"move-{label}-{r}-{way}-{tool}", src, ws, args.size_mb))
                        job_dir = root_a / "jobs" / job
                        folder_mb.append(folder_bytes(job_dir) / 1e6)
                        new = root_b / f"anchor-{seq}"
                        w0 = sum(proxy.counters())
                        if tool == "orch":
                            s, proc = orch.timed("resume", job, "--on", dst, f"--{'through-laptop' if way == 'laptop' else 'direct'}")
                            at = {line.removeprefix("orch:").strip().split()[0]: when for when, line in
                                  reversed(orch.stderr_lines) if line.strip()}
                            said = MOVED.search(proc.stderr)
                            if args.quick:
                                print(f"\n{label} {way}: orch's stderr (s since start):\n" + "\n".join(
                                    f"  {when:6.2f}  {line}" for when, line in orch.stderr_lines), file=sys.stderr)
                            phase.setdefault(f"{label}-{way}-copying", []).append(at.get("b:", at.get("b-far:", 0.0)))
                            phase.setdefault(f"{label}-{way}-moved", []).append(at.get("moved", s))
                            phase.setdefault(f"{label}-{way}-said", []).append(float(said.group(2)) if said else float("nan"))
                            via = "directly" if way == "direct" else "through this laptop"
                            if via not in proc.stderr:
                                print(f"warning: orch resume {way} did not say it copied {via}:\n{proc.stderr}",
                                      file=sys.stderr)
                            moved_dir = root_b / "jobs" / job
                        else:
                            s = (anchor_laptop(cm_a, cm_b, job_dir, new) if way == "laptop"
                                 else anchor_direct(cm_b, port, key, job_dir, new))
                            moved_dir = new
                        t.setdefault(f"{label}-{way}-{tool}", []).append(s)
                        wire.setdefault(f"{label}-{way}-{tool}", []).append(sum(proxy.counters()) - w0)
                        if big_size(moved_dir) != args.size_mb * 1_000_000:
                            print(f"{label} {way} {tool}: {big_size(moved_dir)} bytes of big.bin arrived, not "
                                  f"{args.size_mb * 1_000_000}", file=sys.stderr)
                            raise SystemExit(1)
                        if tool == "orch":
                            settle(root_b, job, f"moved to {dst}")  # untimed: it finds its file and ends
                            left = [p.name for p in (root_b / "jobs").glob(f".move-{job}*")]
                            left += [p.name for p in (root_b / ".orch-move-keys").glob("*/*")]
                            if left:
                                print(f"warning: left on {dst} after the move: {left}", file=sys.stderr)
                            if way == "direct":
                                keys_ok &= keys_file.check(f"after orch resume {job} --on {dst} --direct")
                        for path in (job_dir, moved_dir):
                            shutil.rmtree(path, ignore_errors=True)
            finally:
                cm_a.close()
                cm_b.close()
        keys_ok &= keys_file.check("at the end")

    m = {k: median(v) for k, v in t.items()}
    mb = median(folder_mb)
    rows, rows_p = [], []
    names = {"laptop": ("through the laptop", "tar → tar, 2 CMs"), "direct": ("direct", "rsync on b, from a")}
    for label in links:
        for way in ("laptop", "direct"):
            o, a = m[f"{label}-{way}-orch"], m[f"{label}-{way}-anchor"]
            row = f"{label}: {names[way][0]}"
            rows.append((row, o, names[way][1], a, f"{o / a:.2f}", f"{mb / o:.0f}", f"{mb / a:.0f}"))
            p = {k: median(phase[f"{label}-{way}-{k}"]) for k in ("copying", "moved", "said")}
            wires = (f"{median(wire[f'{label}-{way}-orch']) / 1e6:.1f} / {median(wire[f'{label}-{way}-anchor']) / 1e6:.1f}"
                     if label == "proxy" else "—")
            rows_p.append((row, p["copying"], p["moved"], o, p["said"], wires))
    print(f"job folder {mb:.1f} MB (one {args.size_mb} MB file of random bytes + the job's own small files); "
          f"median of {args.repeat} interleaved rounds; proxy: {args.delay_ms:g} ms each way ({rtt * 1000:g} ms RTT), "
          f"{args.mbit:g} Mbit/s each way; root's ~/.ssh/authorized_keys {keys_file.describe(keys_file.start)} at "
          f"start: {'unchanged after every direct move and at the end' if keys_ok else 'CHANGED (see warnings)'}\n")
    print(table(["row", "orch s", "anchor", "anchor s", "orch/anchor", "orch MB/s", "anchor MB/s"], rows))
    print("\norch's progress lines (median s since the command started) and bytes through the proxy "
          "(both directions):\n")
    print(table(["row", "'copying' line s", "'moved' line s", "returned s", "orch's own 'in N s'",
                 "wire MB orch / anchor"], rows_p))


if __name__ == "__main__":
    main()

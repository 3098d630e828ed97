"""Shared pieces of the benchmarks: a loopback sshd, the latency proxy, timing, tables.

Benchmarks print tables and never assert on times (machines are noisy; see bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.latency_proxy import LatencyProxy
from tests.support.sshd import SSHServer, start_sshd

__all__ = [
    "REPO",
    "link_args",
    "link_parser",
    "ControlMaster",
    "run_cpu",
    "Orch",
    "cpu_load",
    "make_workspace",
    "job_state",
    "wait_job",
    "sshd_and_proxy",
    "LatencyProxy",
    "SSHServer",
    "machine",
    "median",
    "ssh_argv",
    "start_sshd",
    "table",
    "timed",
    "wait_for",
]

SSH_OPTS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            "-o", "BatchMode=yes"]


def link_parser(description: str) -> argparse.ArgumentParser:
    """The benches' shared options (repeats and the latency proxy's link), to add more to."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--mbit", type=float, default=100.0)
    return ap


def link_args(description: str) -> argparse.Namespace:
    """The benches' shared options: repeats and the latency proxy's link."""
    return link_parser(description).parse_args()


@contextmanager
def sshd_and_proxy(prefix: str, args: argparse.Namespace) -> Iterator[tuple[Path, SSHServer, LatencyProxy]]:
    """A temp folder, a loopback sshd in it and a latency proxy in front; all removed after."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    tmp.chmod(0o755)
    server = start_sshd(tmp / "sshd")
    proxy = LatencyProxy(server.port, delay_s=args.delay_ms / 1000, rate_bps=args.mbit * 1e6)
    proxy.start()
    try:
        yield tmp, server, proxy
    finally:
        proxy.stop()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def ssh_argv(port: int, key: Path) -> list[str]:
    """OpenSSH client argv (no destination) for the loopback sshd or the proxy in front of it."""
    return ["ssh", "-p", str(port), "-i", str(key), *SSH_OPTS]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def run_cpu(argv: list[str], **run: Any) -> tuple[float, subprocess.CompletedProcess[Any]]:
    """``subprocess.run(argv, check=True, **run)``: CPU seconds (user + system) of the command
    and its children, and what it returned."""
    before = os.times()
    done = subprocess.run(argv, check=True, **run)
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system), done


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def wait_for(predicate: Callable[[], bool], timeout: float = 60.0, every: float = 0.002) -> float:
    """Poll until ``predicate()``; return the perf_counter time it first held."""
    deadline = time.perf_counter() + timeout
    while not predicate():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"condition not reached within {timeout:.0f} s")
        time.sleep(every)
    return time.perf_counter()


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (pasteable into bench/RESULTS.md)."""
    def cell(v: object) -> str:
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    body = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(headers)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in body]
    return "\n".join(lines)


def machine() -> str:
    load = os.getloadavg()[0]
    rsync = subprocess.run(["rsync", "--version"], check=False, capture_output=True, text=True).stdout.split("\n")[0]
    ssh = subprocess.run(["ssh", "-V"], check=False, capture_output=True, text=True).stderr.strip()
    return (f"{time.strftime('%Y-%m-%d %H:%M %Z')} · {os.cpu_count()} cores {platform.machine()} · "
            f"Python {platform.python_version()} · {rsync} · {ssh} · load avg {load:.2f} at start")


# --- shared by bench/loop.py and bench/throughput.py ---------------------------------------


def workspace_args(ap: argparse.ArgumentParser, what: str = "the big file") -> None:
    """The workspace's size options (defaults: the issue's 2000 × 10 KiB + 50 MB) and
    ``--orch-src``."""
    ap.add_argument("--files", type=int, default=2000, help="number of small files (default 2000)")
    ap.add_argument("--file-kib", type=int, default=10, help="size of each small file in KiB (default 10)")
    ap.add_argument("--big-mb", type=float, default=50, help=f"size of {what} in MB (default 50)")
    ap.add_argument("--orch-src", type=Path, default=REPO, help="source tree of the orch to run (default: this checkout)")


def make_workspace(ws: Path, n_small: int = 2000, small_size: int = 10 << 10, big_size: int = 50_000_000,
                   seed: int = 20240601) -> list[Path]:
    """``n_small`` files of ``small_size`` random bytes in folders of 100, plus ``data/big.bin``
    (``big_size``; none when 0); fixed seed (the defaults give bench/sync.py's bytes). Returns the
    small files."""
    rng = random.Random(seed)
    small = []
    for i in range(n_small):
        path = ws / "src" / f"pkg{i // 100:02d}" / f"mod{i:04d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(small_size))
        small.append(path)
    if big_size:
        (ws / "data").mkdir(parents=True, exist_ok=True)
        (ws / "data" / "big.bin").write_bytes(rng.randbytes(big_size))
    return small


class ControlMaster:
    """A warm OpenSSH ControlMaster (socket in a short private temp dir): ``open()`` before
    timing, then ``argv`` (no destination) is ssh through it; ``close()`` ends the master."""

    def __init__(self, port: int, key: Path) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="cm", dir="/tmp"))  # mode 0700; short: socket paths ≤ ~100 chars
        self.path = self.dir / "s"
        self.argv = [*ssh_argv(port, key), "-o", "ControlMaster=auto", "-o", f"ControlPath={self.path}",
                     "-o", "ControlPersist=600"]

    def open(self) -> None:
        subprocess.run([*self.argv, "root@127.0.0.1", "true"], check=True, stdin=subprocess.DEVNULL)

    def close(self) -> None:
        subprocess.run(["ssh", "-o", f"ControlPath={self.path}", "-O", "exit", "x"], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def _json_objects(text: str) -> list[object]:
    """Every JSON value that starts at the beginning of a line of ``text`` (progress lines around it
    are skipped); an indented object counts once."""
    decoder, found, pos = json.JSONDecoder(), [], 0
    while pos < len(text):
        if text[pos] in "{[":
            try:
                value, end = decoder.raw_decode(text, pos)
                found.append(value)
                pos = end
                continue
            except ValueError:
                pass
        nl = text.find("\n", pos)
        if nl < 0:
            break
        pos = nl + 1
    return found


class Orch:
    """The orch CLI as a user runs it: ``python -m orchestrator ...`` in a subprocess, with its own
    ``ORCH_HOME``, run in ``cwd``, from the source tree ``src`` (default: this checkout). A failed
    command prints its stderr's last lines and stops the bench."""

    def __init__(self, home: Path, cwd: Path, src: Path = REPO) -> None:
        self.cwd = cwd
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_") and k != "PYTHONDONTWRITEBYTECODE"}
        # byte-compiled once, as an installed orch is (pip writes .pyc files): a private cache
        self.env.update(ORCH_HOME=str(home), PYTHONPATH=str(src), PYTHONPYCACHEPREFIX=str(home.parent / "pycache"))
        self.stderr_lines: list[tuple[float, str]] = []

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run one command; ``self.stderr_lines`` gets each stderr line with the seconds since the
        start at which it arrived (orch's progress lines: a phase breakdown seen from outside)."""
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *args], cwd=self.cwd, env=self.env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: list[tuple[float, str]] = []

        def read_stderr() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                lines.append((time.perf_counter() - t0, line.rstrip("\n")))

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        stdout = proc.stdout.read() if proc.stdout else ""
        proc.wait()
        reader.join()
        self.stderr_lines = lines
        stderr = "\n".join(line for _, line in lines)
        if proc.returncode != 0:
            tail = "\n".join((stderr or stdout).strip().splitlines()[-15:])
            print(f"\n`orch {' '.join(args)}` exited {proc.returncode}; its last lines:\n{tail}", file=sys.stderr)
            raise SystemExit(1)
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)

    def timed(self, *args: str) -> tuple[float, subprocess.CompletedProcess[str]]:
        t0 = time.perf_counter()
        proc = self.run(*args)
        return time.perf_counter() - t0, proc

    def phases(self) -> dict[str, float]:
        """The last command's progress lines as {first word: seconds since start}: ``orch: b1:
        syncing 3 file(s)`` → ``syncing``; the first line of each word counts."""
        out: dict[str, float] = {}
        for at, line in self.stderr_lines:
            words = line.removeprefix("orch:").split()
            if words and words[0].endswith(":") and len(words) > 1:
                words = words[1:]
            if words:
                out.setdefault(words[0].strip(":").lower(), at)
        return out

    @contextmanager
    def traced(self, path: Path) -> Iterator[list[dict[str, float]]]:
        """Commands run in the block write their ``ORCH_TRACE`` lines to ``path`` (emptied first);
        the list it gives holds each command's phases (``traced_phases``) once the block ended."""
        path.unlink(missing_ok=True)
        self.env["ORCH_TRACE"] = str(path)
        phases: list[dict[str, float]] = []
        try:
            yield phases
        finally:
            del self.env["ORCH_TRACE"]
        phases.extend(traced_phases(path))

    def add_host(self, name: str, port: int, key: Path, root: Path) -> None:
        self.run("hosts", "add", name, "--ssh", f"ssh -p {port} root@127.0.0.1", "--identity", str(key),
                 "--root", str(root), "--python", sys.executable, "--trust")

    def submit(self, spec: Path) -> tuple[float, str]:
        """``orch submit SPEC --json``: (seconds until it returned, job id)."""
        seconds, proc = self.timed("submit", str(spec), "--json")
        ids = [o["job_id"] for o in _json_objects(proc.stdout) if isinstance(o, dict) and "job_id" in o]
        if not ids:
            print(f"no job_id in orch submit's output:\n{proc.stdout}\n{proc.stderr}", file=sys.stderr)
            raise SystemExit(1)
        return seconds, ids[-1]


def traced_phases(path: Path) -> list[dict[str, float]]:
    """Each command's ORCH_TRACE lines in ``path`` as {phase: ms since its start} (first of each)."""
    out: dict[str, dict[str, float]] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        if not line.startswith("orch-trace "):
            continue
        pid, rest = line.split()[1], line.split("+", 1)[1]
        ms, _, tail = rest.partition(" ms  ")
        out.setdefault(pid, {}).setdefault(tail[:12].strip(), float(ms))
    return list(out.values())


@contextmanager
def cpu_load(on: bool) -> Iterator[None]:
    """With ``on``: one CPU-bound process per core beside the block (a loaded machine)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)] if on else []
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def job_state(root: Path, job_id: str) -> str:
    """The job's state from ``<root>/jobs/<id>/status.json`` (the server is this machine); "" if unreadable."""
    try:
        return str(json.loads((root / "jobs" / job_id / "status.json").read_text()).get("state", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def wait_job(root: Path, job_id: str, timeout: float = 300) -> str:
    """Wait until the job is terminal; return its state (raise on timeout)."""
    wait_for(lambda: job_state(root, job_id) in ("succeeded", "failed", "cancelled", "lost"), timeout, every=0.05)
    return job_state(root, job_id)

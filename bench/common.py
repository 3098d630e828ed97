"""Shared pieces of the benchmarks: a loopback sshd, the latency proxy, timing, tables.

Benchmarks print tables and never assert on times (machines are noisy; see bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.latency_proxy import LatencyProxy
from tests.sshd import SSHServer, start_sshd

__all__ = [
    "REPO",
    "link_args",
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


def link_args(description: str) -> argparse.Namespace:
    """The benches' shared options: repeats and the latency proxy's link."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--mbit", type=float, default=100.0)
    return ap.parse_args()


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

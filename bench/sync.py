"""orch sync vs ``rsync -az`` over ssh, on loopback and through a 20 ms / 100 Mbit/s link.

Workspace: 2000 files of 10 KiB plus one 50 MB file, random bytes from a fixed seed. Against
one real loopback sshd (``tests/support/sshd.py``), for each of: first sync, no change, one file
changed — the median of ``--repeat`` runs of each tool, the two tools alternating. orch is
timed as a user waits for it: open the SSH connection, ``hello`` (the host's sync state),
select and plan, send, close. rsync pays its own ssh handshake the same way.

Also printed: bytes on the wire through the proxy, orch's time by phase and its SSH channels
(round trips) per sync, and the one-time payload install on a fresh host.

    .venv/bin/python bench/sync.py [--repeat 3] [--delay-ms 20] [--mbit 100]
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import common
from common import machine, median, ssh_argv, table

from orchestrator.access.connect import open_transport
from orchestrator.helper.remote import Remote
from orchestrator.hosts.inventory import Host
from orchestrator.sync import record as synccache
from orchestrator.sync import selection
from orchestrator.sync.send import sync

N_SMALL, SMALL_SIZE, BIG_SIZE, SEED = 2000, 10 << 10, 50_000_000, 20240601
ROWS = ("first sync", "no change", "one file changed")


class Counted:
    """Counts the SSH channels (one per remote command: a round trip or more each)."""

    def __init__(self, transport: Any) -> None:
        self.channels = 0
        inner = transport.start

        def start(argv: Any, **kw: Any) -> Any:
            self.channels += 1
            return inner(argv, **kw)

        transport.start = start


def orch_sync(host: Host, ws: Path) -> dict[str, float]:
    """One sync as a user waits for it; returns seconds per phase, ``total`` and ``channels``."""
    t0 = time.perf_counter()
    with open_transport(host, None, lambda fp: False) as transport:
        counted = Counted(transport)
        t1 = time.perf_counter()
        remote = Remote(host, transport)
        hello = synccache.hello(remote, selection.project_name(ws))
        t2 = time.perf_counter()
        sync(remote, ws, [], hello["sync"])
        t3 = time.perf_counter()
    t4 = time.perf_counter()
    return {"total": t4 - t0, "connect": t1 - t0, "hello": t2 - t1, "sync": t3 - t2, "close": t4 - t3,
            "channels": counted.channels}


def rsync(port: int, key: Path, ws: Path, dest: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(["rsync", "-az", "-e", " ".join(ssh_argv(port, key)), f"{ws}/", f"root@127.0.0.1:{dest}/"],
                   check=True)
    return time.perf_counter() - t0


def forget_sync(root: Path, ws: Path) -> None:
    """Make the next orch sync a first sync (the payload stays installed)."""
    project = selection.project_name(ws)
    shutil.rmtree(root / "workspace" / project, ignore_errors=True)
    (root / "state" / f"sync-{project}.json").unlink(missing_ok=True)


def main() -> None:
    args = common.link_args(__doc__.split("\n\n")[0])
    with common.sshd_and_proxy("orch-bench-sync-", args) as (tmp, server, proxy):
        ws = tmp / "project"
        small = common.make_workspace(ws, N_SMALL, SMALL_SIZE, BIG_SIZE, SEED)
        print(f"# orch sync vs rsync -az over ssh — {machine()}")
        print(f"workspace: {N_SMALL} × {SMALL_SIZE >> 10} KiB + 1 × {BIG_SIZE / 1e6:.0f} MB; "
              f"median of {args.repeat}; proxy: {args.delay_ms:g} ms each way, {args.mbit:g} Mbit/s each way\n")
        rows, wire, phases, installs = [], [], [], []
        edit = random.Random(SEED + 1)
        for label, port in (("loopback", server.port), ("proxy", proxy.port)):
            root = tmp / f"remote-{label}"
            host = Host(name="bench", address="127.0.0.1", port=port, user="root", identity_file=str(server.client_key),
                        root=str(root), python=sys.executable, host_key=server.host_key_line)
            # One-time cost on a fresh host: hello finds no payload (exit 97), installs it, retries.
            with open_transport(host, None, lambda fp: False) as transport:
                remote = Remote(host, transport)
                t0 = time.perf_counter()
                remote.call("hello")
                t1 = time.perf_counter()
                remote.call("hello")
                t2 = time.perf_counter()
            installs.append((label, (t1 - t0) - (t2 - t1), t2 - t1))

            times: dict[tuple[str, str], list[float]] = {}
            nbytes: dict[tuple[str, str], list[int]] = {}
            orch_phases: dict[str, list[dict[str, float]]] = {}
            for r in range(args.repeat):
                forget_sync(root, ws)
                dest = root / "rsync-dest"
                shutil.rmtree(dest, ignore_errors=True)
                for row in ROWS:
                    if row == "one file changed":
                        small[r * 37 % N_SMALL].write_bytes(edit.randbytes(SMALL_SIZE))
                    for tool in ("orch", "rsync"):
                        before = sum(proxy.counters())
                        if tool == "orch":
                            ph = orch_sync(host, ws)
                            seconds = ph["total"]
                            orch_phases.setdefault(row, []).append(ph)
                        else:
                            seconds = rsync(port, server.client_key, ws, dest)
                        times.setdefault((row, tool), []).append(seconds)
                        nbytes.setdefault((row, tool), []).append(sum(proxy.counters()) - before)
            for row in ROWS:
                o, s = median(times[(row, "orch")]), median(times[(row, "rsync")])
                rows.append((f"{row} ({label})", o, s, f"{o / s:.2f}"))
                if label == "proxy":
                    bo, bs = median(nbytes[(row, "orch")]), median(nbytes[(row, "rsync")])
                    wire.append((row, f"{bo / 1e6:.3f}", f"{bs / 1e6:.3f}", f"{bo / bs:.2f}"))
                ph = orch_phases[row]
                phases.append((f"{row} ({label})", *(median([p[k] for p in ph]) for k in
                               ("connect", "hello", "sync", "close", "total")), int(median([p["channels"] for p in ph]))))

        print(table(["row", "orch s", "rsync s", "orch/rsync"], rows))
        print("\nbytes on the wire through the proxy (both directions, MB):\n")
        print(table(["row", "orch MB", "rsync MB", "orch/rsync"], wire))
        print("\norch by phase (median s) and SSH channels opened per sync:\n")
        print(table(["row", "connect", "hello", "select+plan+send", "close", "total", "channels"], phases))
        print("\none-time payload install on a fresh host (hello with install minus hello without):\n")
        print(table(["link", "install s", "hello s"], installs))


if __name__ == "__main__":
    main()

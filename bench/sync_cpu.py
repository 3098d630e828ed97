"""A first sync's two ends without SSH: the laptop's tar writer and the server's receive, in CPU seconds.

Where a loopback first sync spends its time once the link is taken away: orch's laptop side
(``orchestrator/sync/send.py``: select, plan, write the tar with each file's sha256) writes the
stream into memory; orch's server side (``remote_payload/helper/workspace.py`` ``receive`` with the
submit's staging, ``stage.py``) reads it back into a fresh root. Both on the same tree, in this
process, timed by CPU (``time.process_time``). The anchor is the same work in C: GNU ``tar -c``
into memory and ``tar -x`` from it (no hashes, no staging: a floor, not an equal), and rsync's own
local copy (``rsync -a WS/ DEST/``, sender and receiver both on this machine, no ssh).

The tree and every destination are on ``--dir`` (default ``/dev/shm``, a tmpfs): a disk's inode
allocation (ext4 after a mass deletion: ~350 µs of kernel CPU per created file) would be
measured instead of the code. Median of ``--repeat`` interleaved rounds.

    .venv/bin/python bench/sync_cpu.py [--repeat 5] [--dir /dev/shm]
"""

from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
import time
from pathlib import Path

import common
from common import machine, median, run_cpu, table

from orchestrator.sync import send
from orchestrator.sync.selection import plan_sync, select_files
from remote_payload.contract.protocol import DATA, END, frame
from remote_payload.helper import stage, workspace
from remote_payload.helper.serve import Input


class Collect:
    """A helper process's stdin that keeps the frames written to it."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.parts.append(frame(DATA, data))

    def close_stdin(self) -> None:
        self.parts.append(frame(END))


def orch_round(ws: Path, scratch: Path, token: str) -> tuple[float, float]:
    """CPU seconds of orch's writer (select, plan, tar) and of the server's receive + staging."""
    c0 = time.process_time()
    plan = plan_sync(ws, select_files(ws, []), {}, False)
    plan.stage = token
    sink = Collect()
    send._write_stream(sink, ws, plan, None)
    c1 = time.process_time()
    stream = Input(io.BufferedReader(io.BytesIO(b"".join(sink.parts))))
    root = tempfile.mkdtemp(dir=scratch)
    reply = workspace.receive(root, "proj", stream, 60, None, stage.finisher(root, workspace.workspace_dir(root, "proj")))
    c2 = time.process_time()
    if reply.get("stage") != {"staged": len(plan.send)}:
        sys.exit(f"orch's receive staged {reply.get('stage')}, not {len(plan.send)} files")
    return c1 - c0, c2 - c1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=Path("/dev/shm"), help="where the tree and the copies go (a tmpfs)")
    common.workspace_args(ap)
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="orch-bench-sync-cpu-", dir=args.dir))
    try:
        ws = scratch / "ws"
        common.make_workspace(ws, args.files, args.file_kib << 10, int(args.big_mb * 1e6))
        total = sum(p.stat().st_size for p in ws.rglob("*") if p.is_file())
        t: dict[str, list[float]] = {}
        tools = ["orch", "tar", "rsync"]
        for r in range(args.repeat):
            for tool in tools[r % 3:] + tools[:r % 3]:
                dest = scratch / f"{tool}-{r}"
                if tool == "orch":
                    writer, receiver = orch_round(ws, scratch, f"t{r}")
                elif tool == "tar":
                    dest.mkdir()
                    blob = scratch / f"tar-{r}.tar"
                    writer = run_cpu(["tar", "-cf", str(blob), "-C", str(ws), "."])[0]
                    receiver = run_cpu(["tar", "-xf", str(blob), "-C", str(dest)])[0]
                    blob.unlink()
                else:
                    writer, receiver = run_cpu(["rsync", "-a", f"{ws}/", f"{dest}/"])[0], 0.0
                t.setdefault(f"{tool}-w", []).append(writer)
                t.setdefault(f"{tool}-r", []).append(receiver)
        m = {k: median(v) for k, v in t.items()}
        print(f"# a first sync's two ends without SSH, CPU seconds — {machine()}")
        print(f"tree {total / 1e6:.1f} MB ({args.files} × {args.file_kib} KiB + 1 × {args.big_mb:g} MB) on {args.dir}; "
              f"median of {args.repeat} interleaved rounds\n")
        orch_total, tar_total = m["orch-w"] + m["orch-r"], m["tar-w"] + m["tar-r"]

        def ratio(other: float) -> str:  # a tiny tree's C side can take less than the clock's 10 ms
            return f"{orch_total / other:.2f}" if other > 0 else "—"

        rows = [("orch (tar + sha256 / receive + hash + stage)", m["orch-w"], m["orch-r"], orch_total, "1.00"),
                ("GNU tar -c / tar -x (no hashes, no staging)", m["tar-w"], m["tar-r"], tar_total, ratio(tar_total)),
                ("rsync -a, local (both ends together)", "—", "—", m["rsync-w"], ratio(m["rsync-w"]))]
        print(table(["implementation", "laptop side s", "server side s", "both s", "orch / this"], rows))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()

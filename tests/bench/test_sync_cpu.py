"""bench/sync_cpu.py on a small tree: orch's laptop writer and server receive (with staging) run
end to end against GNU tar and rsync, and the table names every row, orch's with a number in
every cell, each anchor's with its total (it exits non-zero if orch's receive staged anything
but the whole tree)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_sync_cpu_runs_on_a_small_tree(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(REPO / "bench" / "sync_cpu.py"), "--repeat", "1", "--files", "30",
                          "--big-mb", "0.2", "--dir", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "implementation" not in line]
    assert [row.split("|")[1].split()[0] for row in rows] == ["orch", "GNU", "rsync"]
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    assert all(re.fullmatch(r"\d+\.\d\d", value) for value in cells[0][1:])  # orch: every cell measured
    assert all(re.fullmatch(r"\d+\.\d\d", row[3]) for row in cells)  # each anchor's total
    assert list(tmp_path.iterdir()) == []  # its scratch folder is gone

"""bench/ssh_send.py on a few MB against a real loopback sshd: every path (paramiko as orch
connects, paramiko with CTR, OpenSSH through a master and fresh) delivers every byte (the
server's ``wc -c`` is checked by the script, which exits non-zero otherwise) and gets a row
with a number in each cell; its scratch folder is gone after."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_ssh_send_runs_every_path_and_counts_the_bytes(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(REPO / "bench" / "ssh_send.py"), "--mb", "3", "--repeat", "1",
                          "--dir", str(tmp_path)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.stdout.splitlines()
            if line.startswith("| ") and "wall s" not in line]
    assert [row[0] for row in rows] == ["paramiko (orch: GCM first)", "paramiko aes128-ctr", "OpenSSH ControlMaster",
                                        "OpenSSH fresh"]
    assert all(re.fullmatch(r"\d+(\.\d+)?", cell) for row in rows for cell in row[1:]), out.stdout
    assert [row[5] for row in rows][2] == "1.00"  # the anchor's own ratio
    assert list(tmp_path.iterdir()) == []

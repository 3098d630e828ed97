"""The SSH data path alone: bytes from memory into ``wc -c`` on the loopback sshd,
through paramiko as orch connects vs OpenSSH's client.

What a first sync's bytes cost before any file is read or written (issue 26, item 3): the
same N MB (random, default 70, a first sync's workspace) sent one way over one exec channel,

- **paramiko (orch)**: ``orchestrator/transport/ssh.py``'s ``transport`` (its window and packet
  sizes, AES-GCM first), ``Channel.sendall`` in 1 MiB blocks, the connection opened before
  timing (orch's holder keeps it warm);
- **paramiko aes128-ctr**: the same with GCM disabled (the cipher choice's share);
- **OpenSSH ControlMaster**: ``ssh`` through a warm master (the master does the encryption);
- **OpenSSH fresh**: ``ssh`` connecting anew, key exchange and authentication included.

Per row: wall seconds until the remote ``wc`` exited (its count checked), MB/s, the sending
side's CPU (paramiko: this process, its transport thread included; OpenSSH: the client and the
master), and the whole machine's CPU (``/proc/stat``: both ends, sshd and ``wc`` included; read
it on a quiet machine). Median of ``--repeat`` interleaved rounds (order rotated).

    .venv/bin/python bench/ssh_send.py [--mb 70] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import paramiko
from common import ControlMaster, machine, median, run_cpu, ssh_argv, start_sshd, table

from orchestrator.transport.ssh import transport

BLOCK = 1 << 20
DEST = "root@127.0.0.1"
SINK = "wc -c"  # the bytes counted where they land: a path that lost some fails the bench


def machine_cpu() -> float:
    """CPU seconds every processor spent busy so far (``/proc/stat``'s first line)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def pid_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def paramiko_send(port: int, key: Path, data: bytes, ctr: bool) -> tuple[float, float, float]:
    """(wall, this process's CPU, machine CPU) of one send over a connection made beforehand."""
    sock = socket.create_connection(("127.0.0.1", port))
    t = transport(sock, {"ciphers": ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com"]} if ctr else None)
    try:
        t.start_client()
        t.auth_publickey("root", paramiko.Ed25519Key.from_private_key_file(str(key)))
        chan = t.open_session()
        chan.exec_command(SINK)
        c0, m0, w0 = time.process_time(), machine_cpu(), time.perf_counter()
        view = memoryview(data)
        for start in range(0, len(data), BLOCK):
            chan.sendall(view[start:start + BLOCK])
        chan.shutdown_write()
        counted = b""
        while chunk := chan.recv(1 << 16):
            counted += chunk
        if chan.recv_exit_status() != 0 or int(counted) != len(data):
            raise SystemExit(f"paramiko: the server counted {counted!r} of {len(data)} bytes")
        return time.perf_counter() - w0, time.process_time() - c0, machine_cpu() - m0
    finally:
        t.close()


def openssh_send(argv: list[str], blob: Path, master_pid: int | None) -> tuple[float, float, float]:
    """(wall, client + master CPU, machine CPU) of ``ssh ARGV DEST 'wc -c' < blob``."""
    master0, m0, w0 = pid_cpu(master_pid) if master_pid else 0.0, machine_cpu(), time.perf_counter()
    with blob.open("rb") as f:
        client, done = run_cpu([*argv, DEST, SINK], stdin=f, capture_output=True)
    wall = time.perf_counter() - w0
    if int(done.stdout) != blob.stat().st_size:
        raise SystemExit(f"OpenSSH: the server counted {done.stdout!r} of {blob.stat().st_size} bytes")
    return wall, client + (pid_cpu(master_pid) - master0 if master_pid else 0.0), machine_cpu() - m0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=70.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None, help="scratch folder (default: the temp dir)")
    args = ap.parse_args()
    data = os.urandom(int(args.mb * 1e6))
    with tempfile.TemporaryDirectory(prefix="orch-bench-ssh-send-", dir=args.dir) as tmp_name:
        tmp = Path(tmp_name)
        tmp.chmod(0o755)
        blob = tmp / "blob"
        blob.write_bytes(data)
        server = start_sshd(tmp / "sshd")
        cm = ControlMaster(server.port, server.client_key)
        try:
            cm.open()
            check = subprocess.run(["ssh", "-o", f"ControlPath={cm.path}", "-O", "check", "x"],
                                   capture_output=True, text=True)
            found = re.search(r"pid=(\d+)", check.stderr + check.stdout)
            master_pid = int(found.group(1)) if found else None
            tools = {
                "paramiko (orch: GCM first)": lambda: paramiko_send(server.port, server.client_key, data, False),
                "paramiko aes128-ctr": lambda: paramiko_send(server.port, server.client_key, data, True),
                "OpenSSH ControlMaster": lambda: openssh_send(cm.argv, blob, master_pid),
                "OpenSSH fresh": lambda: openssh_send(ssh_argv(server.port, server.client_key), blob, None),
            }
            names = list(tools)
            got: dict[str, list[tuple[float, float, float]]] = {name: [] for name in names}
            for r in range(args.repeat):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    got[name].append(tools[name]())
        finally:
            cm.close()
            server.stop()
    print(f"# the SSH data path alone: {args.mb:g} MB into `wc -c` on loopback — {machine()}")
    print(f"median of {args.repeat} interleaved rounds; sender CPU: paramiko's process / OpenSSH's client + master\n")
    m = {name: [median([g[i] for g in got[name]]) for i in range(3)] for name in names}
    anchor = m["OpenSSH ControlMaster"][0]
    rows = [(name, f"{wall:.3f}", f"{args.mb / wall:.0f}", f"{sender:.2f}", f"{whole:.2f}", f"{wall / anchor:.2f}")
            for name, (wall, sender, whole) in m.items()]
    print(table(["path", "wall s", "MB/s", "sender CPU s", "machine CPU s", "wall / OpenSSH CM"], rows))


if __name__ == "__main__":
    main()

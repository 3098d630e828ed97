"""A real OpenSSH server on 127.0.0.1 for tests: own host key, own authorized_keys,
``UsePAM no``. Started as root (CI runs as root); test users are created on demand."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.tiers import need

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, kind: str = "ed25519") -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "orch-test", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().strip() if path.suffix else Path(str(path) + ".pub").read_text().strip()


def ensure_user(name: str, password: str | None = None) -> None:
    """Create a plain login user (bash shell) once; set its password when given. Safe when
    another test process creates the same user at the same time (useradd then fails: exists).
    Test tier ``root`` (tests/support/tiers.py)."""
    need("root", f"ensure_user({name!r})")
    if subprocess.run(["id", name], capture_output=True).returncode != 0:
        made = subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], capture_output=True, text=True)
        if made.returncode != 0 and subprocess.run(["id", name], capture_output=True).returncode != 0:
            raise RuntimeError(f"useradd {name}: {made.stderr.strip()}")
    if password is not None:
        subprocess.run(["chpasswd"], input=f"{name}:{password}\n", text=True, check=True)
    else:  # no password login, but not "locked" ('!'), which sshd without PAM refuses for keys too
        subprocess.run(["usermod", "-p", "*", name], check=True)


@dataclass
class SSHServer:
    port: int
    host_key_line: str
    client_key: Path
    proc: subprocess.Popen
    config: Path

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_sshd(workdir: Path, host_key: Path | None = None, port: int | None = None, extra: str = "") -> SSHServer:
    """Start sshd in the foreground on a free port; return once it accepts connections.
    ``extra``: more sshd_config lines (``Ciphers aes128-ctr``, say). Test tier ``root``: its
    tests log in as root (tests/support/tiers.py)."""
    need("root", "start_sshd")
    workdir.mkdir(parents=True, exist_ok=True)
    os.makedirs("/run/sshd", exist_ok=True)
    if host_key is None:
        host_key = workdir / "host_ed25519"
        if not host_key.exists():
            keygen(host_key)
    client_key = workdir / "client_ed25519"
    if not client_key.exists():
        keygen(client_key)
    auth = workdir / "authorized_keys"
    auth.write_text(Path(str(client_key) + ".pub").read_text())
    auth.chmod(0o644)
    workdir.chmod(0o755)
    port = port or free_port()
    config = workdir / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {workdir}/sshd.pid\n"
        f"AuthorizedKeysFile {auth} .ssh/authorized_keys\nUsePAM no\nStrictModes no\nPermitRootLogin yes\n"
        "PasswordAuthentication yes\nKbdInteractiveAuthentication no\nSubsystem sftp internal-sftp\n"
        "LogLevel ERROR\nMaxStartups 100:30:200\nMaxSessions 100\nClientAliveInterval 0\n" + extra
    )
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL,
                            stderr=open(workdir / "sshd.log", "ab"))
    deadline = time.time() + 10
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {(workdir / 'sshd.log').read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError("sshd did not start listening")
    kind, b64 = Path(str(host_key) + ".pub").read_text().split()[:2]
    return SSHServer(port, f"{kind} {b64}", client_key, proc, config)

"""Host inventory, --ssh parsing, host-key pinning and authentication against real sshd."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import parse_ssh_command
from tests.support.orch import Orch, write_job
from tests.support.sshd import SSHServer, ensure_user, free_port, keygen


@pytest.mark.parametrize("text, expected", [
    ("ssh -p 23456 root@203.0.113.7", {"port": 23456, "user": "root", "address": "203.0.113.7"}),
    ("ssh root@region-9.example.com -p 40022", {"port": 40022, "user": "root", "address": "region-9.example.com"}),
    ("ssh -i ~/.ssh/k -o Port=2222 -o User=me host", {"identity_file": "~/.ssh/k", "port": 2222, "user": "me", "address": "host"}),
    ("me@host:2200", {"user": "me", "port": 2200, "address": "host"}),
    ("ssh://me@[::1]:23", {"user": "me", "port": 23, "address": "::1"}),
])
def test_parse_ssh_command_reads_what_providers_show(text: str, expected: dict) -> None:
    assert parse_ssh_command(text) == expected


@pytest.mark.parametrize("text", ["ssh -p x root@h", "ssh -L 1:h:2 root@h", "ssh root@h ls", "ssh -p 22", ""])
def test_parse_ssh_command_refuses_what_it_cannot_honour(text: str) -> None:
    with pytest.raises(UsageError):
        parse_ssh_command(text)


def add(orch: Orch, sshd: SSHServer, *extra: str, name: str = "box", user: str = "root", check: int = 0):
    return orch("hosts", "add", name, "--ssh", f"ssh -p {sshd.port} {user}@127.0.0.1",
                "--root", str(orch.remote_root), "--python", sys.executable, *extra, check=check)


def test_trust_pins_the_key_and_inventory_files_are_private(orch: Orch, sshd: SSHServer) -> None:
    out = add(orch, sshd, "--identity", str(sshd.client_key), "--trust")
    fingerprint = subprocess.run(["ssh-keygen", "-lf", "/dev/stdin"], input=sshd.host_key_line, text=True,
                                 capture_output=True, check=True).stdout.split()[1]
    assert f"pinned host key ssh-ed25519 {fingerprint}" in out.stderr
    entry = orch.home / "hosts" / "box.json"
    assert json.loads(entry.read_text())["host_key"] == sshd.host_key_line
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE((orch.home / "registry.db").stat().st_mode if (orch.home / "registry.db").exists() else 0o600) == 0o600
    assert "box" in orch("hosts", "ls").stdout and "pinned" in orch("hosts", "ls").stdout


def test_unknown_host_key_is_refused_non_interactively(orch: Orch, sshd: SSHServer) -> None:
    add(orch, sshd, "--identity", str(sshd.client_key))
    spec = write_job(orch.cwd, "j", "box", ["python", "-c", "print(1)"])
    out = orch("submit", str(spec), check=3)
    assert "unknown host key ssh-ed25519 SHA256:" in out.stderr and "orch hosts trust box" in out.stderr
    assert "Traceback" not in out.stderr
    assert not orch.remote_root.exists()


def test_changed_host_key_is_refused_with_both_fingerprints(orch: Orch, sshd: SSHServer, tmp_path: Path) -> None:
    add(orch, sshd, "--identity", str(sshd.client_key), "--trust")
    other = keygen(tmp_path / "other_key")
    entry = orch.home / "hosts" / "box.json"
    data = json.loads(entry.read_text())
    data["host_key"] = " ".join(other.split()[:2])
    entry.write_text(json.dumps(data))
    out = orch("hosts", "trust", "box", check=3)
    assert "DIFFERENT host key" in out.stderr and out.stderr.count("SHA256:") == 2
    assert "Traceback" not in out.stderr


def test_wrong_key_gives_exit_3(orch: Orch, sshd: SSHServer, tmp_path: Path) -> None:
    keygen(tmp_path / "stranger")
    add(orch, sshd, "--identity", str(tmp_path / "stranger"))
    out = orch("hosts", "trust", "box", check=3)
    assert "authentication failed for root@127.0.0.1" in out.stderr and "tried key" in out.stderr


def test_password_login_and_wrong_password(orch: Orch, sshd: SSHServer) -> None:
    ensure_user("orchpw", "s3cret-pw")
    orch("hosts", "add", "pw", "--ssh", f"ssh -p {sshd.port} orchpw@127.0.0.1", "--password-env", "BOX_PW",
         "--python", "/usr/bin/python3")
    entry = (orch.home / "hosts" / "pw.json").read_text()
    assert "s3cret" not in entry
    bad = orch("hosts", "trust", "pw", env={"BOX_PW": "wrong"}, check=3)
    assert "authentication failed" in bad.stderr and "password from $BOX_PW" in bad.stderr
    assert "wrong" not in bad.stderr
    good = orch("hosts", "trust", "pw", env={"BOX_PW": "s3cret-pw"})
    assert "pinned host key" in good.stderr and "s3cret" not in good.stderr + good.stdout


def test_plain_user_with_system_python(orch: Orch, sshd: SSHServer) -> None:
    """A non-root login shell and the distribution's python: the helper runs (stdlib only)."""
    ensure_user("orchplain")
    home = Path("/home/orchplain/.ssh")
    home.mkdir(mode=0o700, exist_ok=True)
    (home / "authorized_keys").write_text(Path(str(sshd.client_key) + ".pub").read_text())
    subprocess.run(["chown", "-R", "orchplain:orchplain", str(home)], check=True)
    out = orch("hosts", "add", "plain", "--ssh", f"ssh -p {sshd.port} orchplain@127.0.0.1", "--identity",
               str(sshd.client_key), "--python", "/usr/bin/python3", "--trust")
    assert "python 3." in out.stderr and "root ~/orch" in out.stderr
    assert Path("/home/orchplain/orch/payload").is_dir()


def test_unreachable_host_gives_exit_3_with_what_was_tried(orch: Orch, sshd: SSHServer) -> None:
    port = free_port()
    orch("hosts", "add", "gone", "--ssh", f"ssh -p {port} root@127.0.0.1")
    out = orch("hosts", "trust", "gone", check=3)
    assert f"cannot reach gone (root@127.0.0.1:{port})" in out.stderr and "tried 2 times" in out.stderr
    assert "orch hosts add gone --ssh" in out.stderr and "Traceback" not in out.stderr

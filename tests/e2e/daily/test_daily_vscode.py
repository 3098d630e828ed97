"""VSCode Remote-SSH and shell conveniences against the loopback sshd: the ssh-config block,
`orch code` (a stand-in `code` records its argv), `orch ssh` with the real OpenSSH client,
`orch exec`, and turning a password login into a key login."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.orch import Orch, write_job
from tests.support.sshd import SSHServer, ensure_user

FOREIGN = "Host work\n    HostName work.example.com\n    User me\n\nHost *\n    ServerAliveCountMax 3\n"


@pytest.fixture
def home(orch: Orch, tmp_path: Path) -> Path:
    """A fake $HOME for the laptop user (ssh config, keys); an extra PATH dir for stand-ins."""
    h = tmp_path / "userhome"
    (h / "bin").mkdir(parents=True)
    orch.env.update(HOME=str(h), PATH=f"{h / 'bin'}:{orch.env['PATH']}")
    return h


def test_ssh_config_block_is_idempotent_and_keeps_foreign_lines(orch: Orch, box: str, sshd: SSHServer,
                                                                 home: Path) -> None:
    config = home / ".ssh" / "config"
    config.parent.mkdir()
    config.write_text(FOREIGN)
    printed = orch("ssh-config").stdout
    assert "Host orch-box\n" in printed and "    HostName 127.0.0.1\n" in printed
    assert f"    Port {sshd.port}\n" in printed and "    User root\n" in printed
    assert f"    IdentityFile {sshd.client_key}\n" in printed and "ServerAliveInterval 15" in printed
    assert config.read_text() == FOREIGN  # printing writes nothing
    orch("ssh-config", "--write")
    first = config.read_text()
    assert first.startswith(FOREIGN) and first.endswith(printed) and first.count("Host orch-box") == 1
    assert (home / ".ssh" / "config.orch-backup").read_text() == FOREIGN
    out = orch("ssh-config", "--write")
    assert "up to date" in out.stderr and config.read_text() == first
    known = orch.home / "known_hosts" / "box"
    assert known.read_text() == f"[127.0.0.1]:{sshd.port} {sshd.host_key_line}\n"
    assert f"UserKnownHostsFile {known}" in first
    # a user edit after the block survives a rewrite with another host added
    config.write_text(first + "Host after\n    User x\n")
    orch("hosts", "add", "other", "--ssh", "ssh -p 2200 me@203.0.113.9")
    orch("ssh-config", "--write")
    text = config.read_text()
    assert text.startswith(FOREIGN) and text.endswith("Host after\n    User x\n")
    assert text.count("Host orch-box") == 1 and "Host orch-other" in text and "not pinned yet" in text


def test_the_written_block_logs_in_with_the_real_ssh_client(orch: Orch, box: str, home: Path) -> None:
    assert orch("ssh", "box", "--", "echo", "hello").stdout == "hello\n"
    orch("ssh-config", "--write")
    ssh = subprocess.run(["ssh", "-F", str(home / ".ssh" / "config"), "-o", "BatchMode=yes", "orch-box", "echo", "ok"],
                         capture_output=True, text=True, timeout=30, env=orch.env)
    assert ssh.returncode == 0 and ssh.stdout == "ok\n", ssh.stderr


def test_code_opens_the_workspace_or_the_job_snapshot(orch: Orch, box: str, home: Path) -> None:
    record = home / "code-argv.json"
    stand_in = home / "bin" / "code"
    stand_in.write_text(f"#!{sys.executable}\nimport json, sys\n"
                        f"open({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    stand_in.chmod(0o755)
    spec = write_job(orch.cwd, "snap", "box", ["python", "-c", "print(1)"])
    orch("code", "box", "--workspace", str(orch.cwd / "ws"))
    assert json.loads(record.read_text()) == ["--remote", "ssh-remote+orch-box", str(orch.server_workspace(orch.cwd / "ws"))]
    assert "Host orch-box" in (home / ".ssh" / "config").read_text()
    orch("code", "box")
    assert json.loads(record.read_text())[-1] == f"{orch.remote_root}/workspace"
    job_id = orch.json("submit", str(spec))["job_id"]
    orch("code", "box", job_id[:8])
    assert json.loads(record.read_text())[-1] == f"{orch.remote_root}/jobs/{job_id}/code"
    assert orch("code", "local", check=2).stderr.startswith("error: `local` is this machine")


def test_code_missing_from_path_is_a_clear_usage_error(orch: Orch, box: str, home: Path) -> None:
    out = orch("code", "box", env={"PATH": str(home / "bin") + ":/usr/bin:/bin"}, check=2)
    assert "`code` command is not on PATH" in out.stderr and "Traceback" not in out.stderr


def test_exec_streams_output_and_keeps_the_exit_code(orch: Orch, box: str) -> None:
    out = orch("exec", "box", "--", "sh", "-c", 'echo "a b;$1"; echo err >&2; exit 7', "sh", "$(x) 'q'", check=7)
    assert out.stdout == "a b;$(x) 'q'\n" and out.stderr == "err\n"
    assert orch("exec", "local", "--", sys.executable, "-c", "print(6*7)").stdout == "42\n"


def test_exec_runs_one_argument_with_shell_syntax_as_a_shell_line(orch: Orch, box: str) -> None:
    """One argument with shell syntax is a `bash -c` line; several arguments stay an argv (no
    shell sees them); a single plain word is a program, and a missing one says how to pipe."""
    assert orch("exec", "box", "--", "echo a b | tr a-z A-Z").stdout == "A B\n"
    assert orch("exec", "box", "--", 'echo one && echo gone > /dev/null; echo "$((6 * 7))"').stdout == "one\n42\n"
    assert orch("exec", "box", "--", "exit 3", check=3).stdout == ""
    assert orch("exec", "box", "--", "echo", "a|b").stdout == "a|b\n"
    assert orch("exec", "box", "--", "printf", "%s\\n", "a b", "$HOME", "x; y").stdout == "a b\n$HOME\nx; y\n"
    assert orch("exec", "local", "--", "echo a b | tr a-z A-Z").stdout == "A B\n"
    for host in ("box", "local"):
        missing = orch("exec", host, "--", "no-such-tool-xyz", check=127)
        assert "'no-such-tool-xyz' was not found?" in missing.stderr and "ONE quoted argument" in missing.stderr
        assert f"orch exec {host} -- 'nvidia-smi | head'" in missing.stderr and "Traceback" not in missing.stderr
    assert "ONE quoted argument" not in orch("exec", "box", "--", "no-such-tool-xyz | cat").stderr
    assert "bash -c" in orch("exec", "--help").stdout


def test_exec_shell_line_sees_the_login_shells_path(orch: Orch, sshd: SSHServer) -> None:
    """A plain user whose tools are on the PATH of a login shell only (like AutoDL's conda)."""
    ensure_user("orchexec")
    home = Path("/home/orchexec")
    (home / ".ssh").mkdir(mode=0o700, exist_ok=True)
    (home / ".ssh" / "authorized_keys").write_text(Path(str(sshd.client_key) + ".pub").read_text())
    (home / "tools").mkdir(exist_ok=True)
    (home / "tools" / "mytool").write_text("#!/bin/sh\necho from-login-path \"$@\"\n")
    (home / "tools" / "mytool").chmod(0o755)
    (home / ".bash_profile").write_text('export PATH="$HOME/tools:$PATH"\n')
    subprocess.run(["chown", "-R", "orchexec:orchexec", str(home)], check=True)
    orch("hosts", "add", "ex", "--ssh", f"ssh -p {sshd.port} orchexec@127.0.0.1", "--identity", str(sshd.client_key),
         "--python", "/usr/bin/python3", "--trust")
    assert orch("exec", "ex", "--", "mytool | tr a-z A-Z").stdout == "FROM-LOGIN-PATH\n"
    assert orch("exec", "ex", "--", "mytool", "a  b").stdout == "from-login-path a  b\n"


def test_install_key_turns_a_password_login_into_a_key_login(orch: Orch, sshd: SSHServer, home: Path) -> None:
    ensure_user("orchkey", "pw-to-key-1")
    keys = Path("/home/orchkey/.ssh")
    if keys.exists():
        subprocess.run(["rm", "-rf", str(keys)], check=True)
    add = ["hosts", "add", "kb", "--ssh", f"ssh -p {sshd.port} orchkey@127.0.0.1", "--password-env", "KB_PW",
           "--python", "/usr/bin/python3", "--trust", "--install-key"]
    out = orch(*add, env={"KB_PW": "pw-to-key-1"})
    private = home / ".ssh" / "id_ed25519"
    assert f"generating {private}" in out.stderr and "logged in with the key alone" in out.stderr
    entry = json.loads((orch.home / "hosts" / "kb.json").read_text())
    assert entry["identity_file"] == str(private) and entry["password_env"] is None
    assert "pw-to-key-1" not in (orch.home / "hosts" / "kb.json").read_text() + out.stdout + out.stderr
    authorized = keys / "authorized_keys"
    assert authorized.read_text() == Path(str(private) + ".pub").read_text()
    assert stat.S_IMODE(authorized.stat().st_mode) == 0o600 and stat.S_IMODE(keys.stat().st_mode) == 0o700
    # key-only from now on: no password in the environment
    assert orch("exec", "kb", "--", "whoami", env={"KB_PW": ""}).stdout == "orchkey\n"
    again = orch(*add, env={"KB_PW": "pw-to-key-1"})
    assert "was already in" in again.stderr and "generating" not in again.stderr
    assert authorized.read_text().count("ssh-ed25519") == 1
    bad = orch("hosts", "add", "kb2", "--ssh", f"ssh -p {sshd.port} orchkey@127.0.0.1", "--install-key", check=2)
    assert "--password-env" in bad.stderr

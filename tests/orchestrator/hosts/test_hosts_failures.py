"""`orch hosts add` that fails saves nothing (a new host is not saved, an existing entry stays
as it was), and a root orch cannot write is one line naming the path and the fix — all
through the real CLI against the loopback sshd, with plain (non-root) users where it matters."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.orch import Orch, write_job
from tests.support.sshd import SSHServer, ensure_user, free_port, keygen

AUTODL_ROOT = "/root/autodl-tmp/orch"


def entries(orch: Orch) -> dict[str, str]:
    """Every inventory file's text, by name: what a failed command must leave untouched."""
    folder = orch.home / "hosts"
    return {p.stem: p.read_text() for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def listed(orch: Orch) -> str:
    return orch("hosts", "ls").stdout


def key_user(name: str, sshd: SSHServer) -> None:
    """A plain login user that accepts the test client key."""
    ensure_user(name)
    ssh = Path(f"/home/{name}/.ssh")
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "authorized_keys").write_text(Path(str(sshd.client_key) + ".pub").read_text())
    subprocess.run(["chown", "-R", f"{name}:{name}", str(ssh)], check=True)


def add_root_box(orch: Orch, sshd: SSHServer, *extra: str, check: int = 0) -> subprocess.CompletedProcess[str]:
    return orch("hosts", "add", "box", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity",
                str(sshd.client_key), "--python", sys.executable, *extra, check=check)


# -- issue 9: a failed `hosts add` is not saved ------------------------------------------------

def test_unreachable_add_is_not_saved_and_an_update_keeps_the_old_entry(orch: Orch, sshd: SSHServer) -> None:
    port = free_port()  # nothing listens there
    out = orch("hosts", "add", "gone", "--ssh", f"ssh -p {port} root@127.0.0.1", "--trust", check=3)
    assert f"cannot reach gone (root@127.0.0.1:{port})" in out.stderr
    assert "gone was not saved" in out.stderr and "Traceback" not in out.stderr
    assert entries(orch) == {} and "gone" not in listed(orch)
    add_root_box(orch, sshd, "--root", str(orch.remote_root), "--trust")
    before = entries(orch)
    out = orch("hosts", "add", "box", "--ssh", f"ssh -p {port} root@127.0.0.1", "--identity", str(sshd.client_key),
               "--keep-key", "--trust", check=3)
    assert "box was not updated: its previous entry is unchanged" in out.stderr
    assert entries(orch) == before
    assert orch("exec", "box", "--", "echo", "still fine").stdout == "still fine\n"


def test_wrong_password_is_not_saved_and_does_not_replace_a_good_entry(orch: Orch, sshd: SSHServer) -> None:
    ensure_user("orchpwf", "right-pw-9")
    ssh = f"ssh -p {sshd.port} orchpwf@127.0.0.1"
    out = orch("hosts", "add", "pw", "--ssh", ssh, "--password-env", "PW", "--python", "/usr/bin/python3",
               "--trust", env={"PW": "wrong-pw"}, check=3)
    assert "authentication failed" in out.stderr and "pw was not saved" in out.stderr
    assert "wrong-pw" not in out.stderr and entries(orch) == {} and "pw " not in listed(orch)
    orch("hosts", "add", "pw", "--ssh", ssh, "--password-env", "PW", "--python", "/usr/bin/python3", "--trust",
         env={"PW": "right-pw-9"})
    before = entries(orch)
    out = orch("hosts", "add", "pw", "--ssh", ssh, "--password-env", "PW", "--python", "/usr/bin/python3",
               "--root", "~/elsewhere", "--trust", env={"PW": "wrong-pw"}, check=3)
    assert "authentication failed" in out.stderr and "pw was not updated" in out.stderr
    assert entries(orch) == before and "~/elsewhere" not in listed(orch)
    unset = orch("hosts", "add", "pw", "--ssh", ssh, "--password-env", "NOT_SET_PW", "--trust", check=2)
    assert "$NOT_SET_PW is not set" in unset.stderr and "pw was not updated" in unset.stderr
    assert entries(orch) == before
    assert orch("exec", "pw", "--", "whoami", env={"PW": "right-pw-9"}).stdout == "orchpwf\n"


def test_a_different_host_key_does_not_replace_the_entry(orch: Orch, sshd: SSHServer, tmp_path: Path) -> None:
    add_root_box(orch, sshd, "--root", str(orch.remote_root), "--trust")
    entry = orch.home / "hosts" / "box.json"
    data = json.loads(entry.read_text())
    data["host_key"] = " ".join(keygen(tmp_path / "other_key").split()[:2])  # pinned before a "reinstall"
    entry.write_text(json.dumps(data))
    before = entries(orch)
    out = add_root_box(orch, sshd, "--root", str(tmp_path / "new-root"), "--trust", check=3)
    assert "DIFFERENT host key" in out.stderr and "box was not updated" in out.stderr
    assert entries(orch) == before and not (tmp_path / "new-root").exists()


def test_install_key_failing_saves_nothing(orch: Orch, sshd: SSHServer, tmp_path: Path) -> None:
    """The user's ~/.ssh is a file orch cannot replace: installing the key fails (exit 4) with
    the command shown short (never the install script), and the entry stays as it was."""
    ensure_user("orchikf", "ik-pw-3")
    home_ssh = Path("/home/orchikf/.ssh")
    if home_ssh.is_dir():
        shutil.rmtree(home_ssh)
    home_ssh.write_text("not a folder\n")
    laptop = tmp_path / "userhome"
    laptop.mkdir()
    env = {"IK_PW": "ik-pw-3", "HOME": str(laptop)}
    ssh = f"ssh -p {sshd.port} orchikf@127.0.0.1"
    try:
        out = orch("hosts", "add", "ik", "--ssh", ssh, "--password-env", "IK_PW", "--python", "/usr/bin/python3",
                   "--trust", "--install-key", env=env, check=4)
        assert "installing the key on ik" in out.stderr and "ik was not saved" in out.stderr
        assert "<script," in out.stderr and "authorized_keys" not in out.stderr.split("ran:")[1].splitlines()[0]
        assert "Traceback" not in out.stderr.split("|")[0] and entries(orch) == {}
        orch("hosts", "add", "ik", "--ssh", ssh, "--password-env", "IK_PW", "--python", "/usr/bin/python3",
             "--trust", env=env)
        before = entries(orch)
        out = orch("hosts", "add", "ik", "--ssh", ssh, "--password-env", "IK_PW", "--python", "/usr/bin/python3",
                   "--install-key", env=env, check=4)
        assert "ik was not updated: its previous entry is unchanged" in out.stderr
        assert entries(orch) == before and json.loads(before["ik"])["password_env"] == "IK_PW"
        # not pinned and no --trust: an unknown key is refused without a terminal, and the hint fits
        out = orch("hosts", "add", "ik2", "--ssh", ssh, "--password-env", "IK_PW", "--install-key", env=env, check=3)
        assert "unknown host key" in out.stderr and "ik2 was not saved; to pin the key" in out.stderr
        assert "--trust" in out.stderr and "ik2" not in entries(orch)
    finally:
        home_ssh.unlink()


@pytest.mark.parametrize("existing", [False, True])
def test_interrupted_add_saves_nothing(orch: Orch, sshd: SSHServer, tmp_path: Path, existing: bool) -> None:
    """Ctrl-C after every connection was made, just before the entry would be saved."""
    if existing:
        add_root_box(orch, sshd, "--root", str(orch.remote_root), "--trust")
    before = entries(orch)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "hosts", "add", "box", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1",
         "--identity", str(sshd.client_key), "--python", sys.executable, "--root", str(tmp_path / "other"), "--trust"],
        cwd=orch.cwd, env={**orch.env, "ORCH_TEST_PAUSE": f"hosts-add-unsaved:{hooks}"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (hooks / "hosts-add-unsaved.reached").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert (hooks / "hosts-add-unsaved.reached").exists(), proc.communicate()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert ("box was not updated: its previous entry is unchanged" if existing else "box was not saved") in err
    assert entries(orch) == before and "Traceback" not in err


# -- issue 10: a root orch cannot write is one line with the fix --------------------------------

def one_line_root_error(stderr: str, name: str, path: str) -> None:
    first = stderr.strip().splitlines()
    assert f"error: {name}: cannot write {path} (Permission denied): pass --root to a writable folder, " \
           f"e.g. orch hosts add {name} ... --root ~/orch" in first, stderr
    assert "Traceback" not in stderr and "import os" not in stderr and "ran:" not in stderr


def test_autodl_preset_with_a_plain_user_says_which_root_and_how_to_fix(orch: Orch, sshd: SSHServer) -> None:
    key_user("orchad", sshd)
    ssh = f"ssh -p {sshd.port} orchad@127.0.0.1"
    base = ["hosts", "add", "ad", "--ssh", ssh, "--identity", str(sshd.client_key), "--python", "/usr/bin/python3",
            "--preset", "autodl"]
    out = orch(*base, "--trust", check=4)
    one_line_root_error(out.stderr, "ad", AUTODL_ROOT)
    assert "ad was not saved" in out.stderr and entries(orch) == {}
    orch(*base)  # saved without connecting; every later command says the same one line
    out = orch("hosts", "trust", "ad", check=4)
    assert "pinned host key" in out.stderr
    one_line_root_error(out.stderr, "ad", AUTODL_ROOT)
    one_line_root_error(orch("hosts", "check", "ad", check=4).stderr, "ad", AUTODL_ROOT)
    spec = write_job(orch.cwd, "rootless", "ad", ["python3", "-c", "print(1)"])
    one_line_root_error(orch("submit", str(spec), check=4).stderr, "ad", AUTODL_ROOT)
    out = orch(*base, "--root", "~/orch", "--trust")  # the fix the message names
    assert "root /home/orchad/orch" in out.stderr and Path("/home/orchad/orch/payload").is_dir()


def test_a_root_that_exists_but_is_not_writable_fails_in_one_line(orch: Orch, sshd: SSHServer) -> None:
    """The helper is already there (readable), but the workspace cannot be written: the sync
    step says so in one line, naming the root."""
    key_user("orchro", sshd)
    shared = Path(tempfile.mkdtemp(prefix="orch-ro-"))
    try:
        add_root_box(orch, sshd, "--root", str(shared), "--trust")  # root installs the helper
        subprocess.run(["chmod", "-R", "a+rX,go-w", str(shared)], check=True)
        orch("hosts", "add", "ro", "--ssh", f"ssh -p {sshd.port} orchro@127.0.0.1", "--identity",
             str(sshd.client_key), "--python", "/usr/bin/python3", "--root", str(shared), "--trust")
        spec = write_job(orch.cwd, "readonly", "ro", ["python3", "-c", "print(1)"])
        out = orch("submit", str(spec), check=4)
        one_line_root_error(out.stderr, "ro", str(shared))
        assert not (shared / "workspace").exists()
    finally:
        shutil.rmtree(shared, ignore_errors=True)

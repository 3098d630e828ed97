"""Turn a password login into a key login: pick (or make) the laptop's key, install it.

The password is used for one connection and never written anywhere. The server side is one
agent-free command built from argv (``python -c SCRIPT PUBKEY``): it appends the key to
``~/.ssh/authorized_keys`` unless the same key is already there, with the directory 0700
and the file 0600.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable

from orchestrator.errors import UsageError
from orchestrator.home import orch_home
from orchestrator.hosts.inventory import Host
from orchestrator.transport.base import CommandFailed, Transport

DEFAULT_KEYS = ("id_ed25519", "id_rsa")

INSTALL_SCRIPT = r"""
import os, sys
line = sys.argv[1].strip()
key = line.split()[:2]
d = os.path.expanduser("~/.ssh")
os.makedirs(d, mode=0o700, exist_ok=True)
os.chmod(d, 0o700)
path = os.path.join(d, "authorized_keys")
try:
    with open(path) as f:
        text = f.read()
except FileNotFoundError:
    text = ""
present = any(l.split()[:2] == key for l in text.splitlines() if not l.startswith("#"))
if not present:
    with open(path, "a") as f:
        f.write(("" if not text or text.endswith("\n") else "\n") + line + "\n")
os.chmod(path, 0o600)
print("present" if present else "added")
"""


def ssh_dir() -> Path:
    """``$HOME/.ssh`` (``$HOME`` honoured)."""
    return Path(os.path.expanduser("~")) / ".ssh"


def _pair(path: Path) -> tuple[Path, Path]:
    """(private, public) for a path naming either half."""
    path = path.expanduser()
    if path.suffix == ".pub":
        return path.with_suffix(""), path
    return path, Path(str(path) + ".pub")


def choose_key(key: Path | None, say: Callable[[str], None]) -> tuple[Path, str]:
    """The private key file and its public line: ``key`` if given, else the first of
    ``~/.ssh/id_ed25519``, ``~/.ssh/id_rsa`` that has a ``.pub``; else a new
    ``~/.ssh/id_ed25519`` made with ssh-keygen (announced through ``say`` first)."""
    if key is not None:
        private, public = _pair(key)
        if not public.is_file() or not private.is_file():
            raise UsageError(f"--key {key}: need both {private} and {public}")
        return private, _public_line(public)
    for name in DEFAULT_KEYS:
        private, public = _pair(ssh_dir() / name)
        if public.is_file() and private.is_file():
            return private, _public_line(public)
    private = ssh_dir() / "id_ed25519"
    say(f"no key in {ssh_dir()}: generating {private} (ed25519, no passphrase) with ssh-keygen")
    return _generate(private)


def orch_key(key: Path | None, say: Callable[[str], None]) -> tuple[Path, str]:
    """The key a rented instance is made with: ``key`` if given, else orch's own
    ``ORCH_HOME/ssh/id_ed25519``, made with ssh-keygen the first time (said through ``say``)."""
    if key is not None:
        return choose_key(key, say)
    private = orch_home() / "ssh" / "id_ed25519"
    if private.is_file() and Path(str(private) + ".pub").is_file():
        return private, _public_line(Path(str(private) + ".pub"))
    say(f"generating orch's own SSH key {private} (ed25519) for rented instances")
    return _generate(private)


def _generate(private: Path) -> tuple[Path, str]:
    """A new ed25519 key without a passphrase at ``private`` (its folder 0700)."""
    private.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "orch", "-f", str(private)],
                       check=True, capture_output=True, timeout=60)
    except FileNotFoundError:
        raise UsageError("ssh-keygen is not on PATH: make a key yourself and pass --key FILE") from None
    except subprocess.CalledProcessError as exc:
        raise UsageError(f"ssh-keygen failed: {exc.stderr.decode(errors='replace').strip()}") from None
    return private, _public_line(Path(str(private) + ".pub"))


def _public_line(path: Path) -> str:
    line = path.read_text(encoding="utf-8").strip()
    words = line.split()
    if len(words) < 2 or not words[0].startswith(("ssh-", "ecdsa-", "sk-")) or "\n" in line:
        raise UsageError(f"{path} is not an OpenSSH public key")
    return line


def install_key(transport: Transport, host: Host, public_line: str) -> str:
    """Append ``public_line`` to the login user's authorized_keys; ``"added"`` or ``"present"``."""
    result = transport.run([host.python, "-c", INSTALL_SCRIPT, public_line], timeout=60)
    if not result.ok:
        raise CommandFailed(result, f"installing the key on {host.name} with {host.python}")
    words = result.stdout.decode("utf-8", "replace").split()
    return words[-1] if words else "added"


REMOVE_SCRIPT = r"""
import os, sys
key = sys.argv[1].split()[:2]
path = os.path.expanduser("~/.ssh/authorized_keys")
with open(path) as f:
    lines = f.read().splitlines(True)
kept = [l for l in lines if l.split()[:2] != key]
if len(kept) != len(lines):
    tmp = path + ".orch-tmp"
    with open(tmp, "w") as f:
        f.writelines(kept)
    os.chmod(tmp, os.stat(path).st_mode & 0o777)
    os.replace(tmp, path)
print("removed" if len(kept) != len(lines) else "absent")
"""


def remove_key(transport: Transport, host: Host, public_line: str) -> None:
    """Take ``public_line``'s key out of the login user's authorized_keys (each line holding it)."""
    result = transport.run([host.python, "-c", REMOVE_SCRIPT, public_line], timeout=60)
    if not result.ok:
        raise CommandFailed(result, f"removing the temporary key from {host.name}")

"""The orch-managed block in ``~/.ssh/config`` (VSCode Remote-SSH, plain ``ssh``).

One ``Host orch-<name>`` per inventory host, between two marker lines. Promises: lines
outside the markers are never changed; writing is idempotent (the same inventory gives the
same bytes, and an unchanged file is not rewritten); the previous file is copied to
``config.orch-backup`` before every change; each host's pinned key is written to its own
``UserKnownHostsFile`` under ``ORCH_HOME/known_hosts/`` so OpenSSH checks the same key orch does.
A provider host's endpoint is kept in its entry (``Host.seen``) once the system ssh may use it,
and renewed after a power-on (``renew_user_config``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

from orchestrator.errors import UsageError
from orchestrator.home import orch_home, write_private
from orchestrator.hosts.inventory import Host, Inventory, SeenEndpoint

BEGIN = "# >>> orch managed block: `orch ssh-config --write` rewrites it; edits inside are lost >>>"
END = "# <<< orch managed block <<<"
ALIAS_PREFIX = "orch-"
SERVER_ALIVE_S = 15


def alias(host: Host) -> str:
    """The ``Host`` name orch uses for an inventory entry in ssh config."""
    return ALIAS_PREFIX + host.name


def user_ssh_config() -> Path:
    """``$HOME/.ssh/config`` (``$HOME`` is honoured, so tests can point it elsewhere)."""
    return Path(os.path.expanduser("~")) / ".ssh" / "config"


def known_hosts_line(host: Host) -> str:
    """The pinned key in known_hosts format: ``[address]:port type base64`` (bare address on 22);
    a provider host's under its alias (``HostKeyAlias``: its address and port change)."""
    if not host.host_key:
        raise UsageError(f"{host.name}: no pinned host key (orch hosts trust {host.name})")
    if host.provider is not None:
        name = alias(host)
    else:
        name = host.address if host.port == 22 else f"[{host.address}]:{host.port}"
    return f"{name} {host.host_key.strip()}\n"


def provider_key(home: Path | None = None) -> Path:
    """The key the system ssh uses for a provider host that logs in with a password (AutoDL):
    orch's own, which ``orch ssh``/``orch code`` put into the box's authorized_keys."""
    return (home or orch_home()) / "ssh" / "id_ed25519"


def known_hosts_file(host: Host, home: Path | None = None) -> Path:
    return (home or orch_home()) / "known_hosts" / host.name


def _value(word: str, what: str, host: Host) -> str:
    """One ssh_config argument: quoted when it holds spaces; refused when it cannot be written."""
    if not word or any(c in word for c in '"\n\r\t\x00'):
        raise UsageError(f"{host.name}: {what} {word!r} cannot be written to ssh config")
    return f'"{word}"' if " " in word else word


def host_stanza(host: Host, home: Path | None = None) -> str:
    """The ``Host orch-<name>`` section for one ssh host; writes its known_hosts file. A
    provider host's is where its sshd answered last (``Host.seen``), checked against the
    pinned key under its alias wherever the provider moves it."""
    lines = [f"Host {alias(host)}"]
    if host.provider is not None and host.seen is not None:
        lines += [f"    # {host.provider.name} instance: this address and port hold until it is powered off; "
                  f"`orch up {host.name}` or `orch code {host.name}` renews them",
                  f"    HostName {_value(host.seen.address, 'address', host)}", f"    Port {host.seen.port}",
                  f"    User {_value(host.seen.user, 'user', host)}", f"    HostKeyAlias {alias(host)}"]
    else:
        lines += [f"    HostName {_value(host.address, 'address', host)}",
                  f"    Port {host.port}", f"    User {_value(host.user, 'user', host)}"]
    identity = host.identity_file or (str(provider_key(home)) if host.provider is not None else None)
    if identity:
        path = Path(identity).expanduser()
        lines += [f"    IdentityFile {_value(str(path.absolute()), 'identity file', host)}", "    IdentitiesOnly yes"]
    if host.host_key:
        known = known_hosts_file(host, home)
        write_private(known, known_hosts_line(host))
        lines += [f"    UserKnownHostsFile {_value(str(known), 'known_hosts path', host)}",
                  "    StrictHostKeyChecking yes"]
    else:
        lines.append(f"    # host key not pinned yet: orch hosts trust {host.name}")
    lines.append(f"    ServerAliveInterval {SERVER_ALIVE_S}")
    return "\n".join(lines) + "\n"


def render_block(hosts: list[Host], home: Path | None = None) -> str:
    """The whole managed block (markers included) for the ssh hosts of ``hosts``; a provider
    host has one once ``orch up``/``ssh``/``code`` saw where it answers (``Host.seen``)."""
    stanzas = [host_stanza(h, home) for h in sorted(hosts, key=lambda h: h.name)
               if h.kind == "ssh" and (h.provider is None or h.seen is not None)]
    return BEGIN + "\n" + "\n".join(stanzas) + END + "\n"


def inventory_block(inventory: Inventory) -> str:
    """``render_block`` of every host of ``inventory``."""
    return render_block(inventory.list(), inventory.home)


def replace_block(text: str, block: str) -> str:
    """``text`` with its managed block replaced by ``block`` (appended when there is none).

    Raises ``UsageError`` when the markers are unbalanced, rather than guessing."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.rstrip("\r\n") == BEGIN]
    ends = [i for i, line in enumerate(lines) if line.rstrip("\r\n") == END]
    if not starts and not ends:
        sep = "" if not text else ("\n" if text.endswith("\n") else "\n\n")
        return text + sep + block
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise UsageError("the orch block markers in ~/.ssh/config are damaged: fix or remove them by hand")
    return "".join(lines[:starts[0]]) + block + "".join(lines[ends[0] + 1:])


def write_block(block: str, path: Path | None = None) -> bool:
    """Put ``block`` into ``path`` (default ``~/.ssh/config``); back the old file up first.

    Returns whether the file changed."""
    path = path or user_ssh_config()
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    new = replace_block(old, block)
    if new == old:
        return False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.is_file():
        shutil.copy2(path, path.with_name(path.name + ".orch-backup"))
    mode = path.stat().st_mode & 0o777 if path.is_file() else 0o600
    tmp = path.with_name(f".{path.name}.orch-{os.getpid()}.tmp")
    tmp.write_text(new, encoding="utf-8")
    tmp.chmod(mode)
    os.replace(tmp, path)
    return True


def own_config(block: str, home: Path | None = None) -> Path:
    """The block alone in ``ORCH_HOME/ssh_config``: what ``orch ssh`` passes to ``ssh -F``."""
    path = (home or orch_home()) / "ssh_config"
    write_private(path, block)
    return path


def write_user_config(inventory: Inventory, say: Callable[[str], None]) -> None:
    """Write ``inventory``'s managed block into ``~/.ssh/config`` and say whether it changed."""
    path = user_ssh_config()
    changed = write_block(inventory_block(inventory), path)
    say(f"{path}: orch block {'updated (backup: ' + path.name + '.orch-backup)' if changed else 'up to date'}")


def remember_seen(inventory: Inventory, host: Host, live: Host) -> bool:
    """Keep ``live``'s address, port and user as ``host``'s entry's ``seen`` (never a
    password); whether they changed."""
    seen = SeenEndpoint(address=live.address, port=live.port, user=live.user)
    if host.seen == seen:
        return False
    inventory.save(host.model_copy(update={"seen": seen}))
    return True


def renew_user_config(inventory: Inventory, host: Host, live: Host, say: Callable[[str], None]) -> None:
    """After a power-on: a provider host's new endpoint (``live``) in the entry and, when the
    user wrote orch's block into ~/.ssh/config before, in that block too. Nothing for a host
    never opened with the system ssh."""
    if host.seen is not None and remember_seen(inventory, host, live):
        path = user_ssh_config()
        if path.is_file() and BEGIN in path.read_text(encoding="utf-8", errors="replace"):
            write_user_config(inventory, say)

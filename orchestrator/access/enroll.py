"""A host entry made one orch can use, the connecting steps of ``orch hosts add`` and ``orch
hosts trust``: the server's host key pinned with orch's helper answering (``trust``), a
password login turned into a key login and proven (``key_login``), a pinned key kept across a
re-add (``kept_key``), and ``hosts add``'s steps on an entry not saved yet (``verify``: any
failure leaves the inventory as it was).

Nothing here prints or asks a person: progress goes to ``say``, a question to the callable
given (``ask_on_tty`` for a new host key of a password login). The helper's ``hello`` comes
in as a callable too (``orchestrator/helper/`` sits beside ``access/``, never under it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from orchestrator.access import keys
from orchestrator.access.connect import ask_on_tty, open_transport
from orchestrator.errors import HostError, HostKeyError, NotSaved, OrchError
from orchestrator.hosts.inventory import Host, Inventory
from orchestrator.testhooks import pause
from orchestrator.transport.base import CommandFailed, Transport, never

Hello = Callable[[Host, Transport], dict[str, Any]]  # the helper's hello on a connection (helper/remote.py)


def trust(host: Host, inventory: Inventory, say: Callable[[str], None], *, save: bool, hello: Hello) -> Host:
    """Connect, accept the key the server offers, run ``hello`` (it installs the helper: proves
    the python and the root work) and return ``host`` with the key pinned; the fingerprint (or
    that the pinned key matches) and the host's python and root are said. ``save``: the key
    goes into the inventory entry as soon as the connection is made (``hosts trust``);
    otherwise it is only in the returned copy (``hosts add`` saves the whole entry once every
    step worked)."""
    shown: list[str] = []
    pinned: list[str] = []

    def accept(fingerprint: str) -> bool:
        shown.append(fingerprint)
        return True

    def said_key() -> None:
        say(f"{host.name}: pinned host key {shown[0]}" if shown else f"{host.name}: host key matches the pinned one")

    with open_transport(host, inventory, accept, None if save else pinned.append) as transport:
        if save:
            said_key()
        answer = hello(host, transport)
    if not save:
        said_key()
    say(f"{host.name}: python {answer.get('python_version')} at {answer.get('python')}, root {answer.get('root')}")
    if pinned:
        return host.model_copy(update={"host_key": pinned[0]})
    return inventory.get(host.name) if save else host


def key_login(host: Host, key: Path | None, say: Callable[[str], None]) -> Host:
    """Password login once (a new host key asked about at a terminal) → the public key of
    ``key`` (``keys.choose_key``: the default one, made when there is none) appended to the
    login user's authorized_keys → a login with the key alone proven → ``host`` with
    ``identity_file`` and without ``password_env``, its host key pinned in the copy. Saves
    nothing: the caller saves the entry. ``HostError`` when the key alone does not log in."""
    private, public_line = keys.choose_key(key, say)
    pinned: list[str] = []
    with open_transport(host, None, ask_on_tty, pinned.append) as transport:
        done = keys.install_key(transport, host, public_line)
    if pinned:
        host = host.model_copy(update={"host_key": pinned[0]})
    say(f"{host.name}: key {private} {'was already' if done == 'present' else 'is now'} in ~/.ssh/authorized_keys")
    keyed = host.model_copy(update={"identity_file": str(private), "password_env": None})
    try:
        with open_transport(keyed, None, never) as transport:
            result = transport.run(["true"], timeout=60)
    except HostError as exc:
        raise HostError(f"the key was installed, but a login with it alone failed (drop --install-key to keep "
                        f"using ${host.password_env}).\n{exc}") from None
    if not result.ok:
        raise CommandFailed(result, "a test command over the key login")
    say(f"{host.name}: logged in with the key alone; the password is no longer used")
    return keyed


def verify(host: Host, inventory: Inventory, say: Callable[[str], None], *, had_entry: bool, pin: bool,
           install_key: bool, key: Path | None, hello: Hello) -> Host:
    """``hosts add``'s connecting steps on an entry that is not saved yet: pin the host key
    (``pin``: ``trust``), install the public key (``install_key``: ``key_login``); returns the
    entry to save. Any failure — unreachable, refused login, a different host key, an
    unwritable root — raises ``NotSaved`` keeping the cause's exit code (with a hint when an
    unpinned key was refused); Ctrl-C is said (the entry not saved, or an existing one
    unchanged) and raised again. Either way the inventory is as it was."""
    try:
        if pin:
            host = trust(host, inventory, say, save=False, hello=hello)
        if install_key:
            host = key_login(host, key, say)
        pause("hosts-add-unsaved")
    except OrchError as exc:
        hint = None
        if isinstance(exc, HostKeyError) and host.host_key is None:
            hint = f"to pin the key while adding the host, add --trust to `orch hosts add {host.name}`"
        raise NotSaved(exc, host.name, had_entry, hint) from None
    except KeyboardInterrupt:
        say(f"{host.name} was not " + ("updated: its previous entry is unchanged" if had_entry else "saved"))
        raise
    return host


def kept_key(old: Host, new: Host, *, keep_key: bool, pin: bool, confirm: Callable[[str], bool | None],
             say: Callable[[str], None]) -> str | None:
    """The pinned key a re-added host keeps: ``old``'s when the address and port are the same;
    after a move (a new port after an AutoDL restart) only with ``keep_key`` or a yes from
    ``confirm(question)``. Otherwise None, and ``say`` tells how to pin the new one (``pin``:
    ``hosts add --trust`` pins it now)."""
    if (old.address, old.port) == (new.address, new.port) or keep_key:
        return old.host_key
    if confirm(f"{old.name} moved from {old.address}:{old.port} to {new.address}:{new.port}. "
               "Keep requiring the same host key (yes for a restarted instance)?"):
        return old.host_key
    say(f"{old.name}: the pinned host key was dropped (the address changed); " +
        ("--trust pins the one the server offers now" if pin else
         f"pin the new one with `orch hosts trust {old.name}` or pass --keep-key"))
    return None

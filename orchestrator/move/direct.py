"""A move's files copied server to server, when the target can reach the source over SSH.

Never silent about keys: the target makes a fresh key pair for this copy, its public half goes
into the source's authorized_keys only after the user agreed (``--direct``, or yes at a
terminal), and it is taken out again when the copy ends, whatever happened
(``remote_payload/move/pull.py`` deletes the private half on the target). The target trusts
only the source's host key as pinned in this laptop's inventory.
"""

from __future__ import annotations

from typing import Any, Callable

from orchestrator.access import keys
from orchestrator.ask import confirm
from orchestrator.errors import RemoteError
from orchestrator.helper.remote import Remote
from orchestrator.hosts.hostkey import key_line_problem
from orchestrator.transport import shell

Say = Callable[[str], None]


def why_not(source: Remote, target: Remote) -> str | None:
    """Why ``target`` cannot pull from ``source`` directly, or None when it can."""
    src = source.host
    if src.kind != "ssh" or target.host.kind != "ssh":
        return "one side is this machine (the copy through it is already direct)"
    if src.slurm or target.host.slurm:
        return "a Slurm login node takes part"
    if not src.host_key:
        return f"{src.name} has no pinned host key in the inventory (orch hosts trust {src.name})"
    check = target.call("tcp_check", host=src.address, port=src.port)
    if not check.get("ok"):
        return f"{target.host.name} cannot reach {src.address}:{src.port} ({check.get('reason')})"
    return None


def choose(source: Remote | None, target: Remote, direct: bool | None, say: Say) -> bool:
    """Whether ``target`` pulls from ``source`` itself: never when ``direct`` is False; when it
    can (``why_not``), with ``direct`` True, or after a yes at a terminal; else through the laptop."""
    if direct is False or source is None:
        return False
    reason = why_not(source, target)
    if reason is not None:
        if direct:
            say(f"not copying directly: {reason}; copying through this laptop")
        return False
    if direct:
        return True
    question = (f"{target.host.name} can reach {source.host.name} over SSH: copy directly? A fresh key of "
                f"{target.host.name}'s goes into {source.host.name}'s authorized_keys for the copy and is removed after")
    answer = confirm(question, default=True)
    if answer is not None:
        return answer
    say(f"copying through this laptop; --direct lets {target.host.name} copy from {source.host.name} itself "
        "(with a temporary key, removed after)")
    return False


def pull(source: Remote, target: Remote, job_id: str, expected: list[dict[str, Any]],
         requests: list[dict[str, Any]]) -> dict[str, Any]:
    """The target copies ``requests`` from the source's job into its staging folder."""
    pair = target.call("move_key", job=job_id)
    public = pair["public"]
    problem = key_line_problem(" ".join(public.split()[:2]))
    if problem is not None or not public.startswith("ssh-ed25519 "):
        raise RemoteError(f"{target.host.name} made an odd key for the copy: {problem or public[:60]}")
    keys.install_key(source.transport, source.host, public)
    try:
        src = source.host
        return target.call("move_pull", job=job_id, key=pair["key"], address=src.address, port=src.port, user=src.user,
                           host_key=src.host_key or "", command=shell.join(source.argv()), files=expected,
                           requests=requests, timeout=None)
    finally:
        keys.remove_key(source.transport, source.host, public)

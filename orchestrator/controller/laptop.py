"""What the laptop knows of its managed jobs, and the controller's word brought into its registry.

``ORCH_HOME/managed.json`` maps each managed job to the host of the controller that took it,
with the controller's last answer about it (host now, recoveries, phase, note): ``orch status``
of finished managed jobs shows that without asking anyone. ``refresh`` asks the controller (one
command) when a listed managed job is not finished here; a job the controller moved is moved in
the laptop's registry too, in one transaction with the fence of the attempt it left
(``Registry.move``), so every command reaches it where it runs now. A controller that does not
answer is one warning: the jobs are then asked of their hosts as before. Light to import (no
paramiko, no pydantic): ``orch status`` of finished jobs reads ``managed.json`` alone.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from orchestrator.errors import OrchError, UsageError
from orchestrator.home import write_private
from orchestrator.state.registry import TERMINAL, Registry

if TYPE_CHECKING:
    from orchestrator.hosts.inventory import Inventory

Say = Callable[[str], None]
FILE = "managed.json"


def _read(home: Path) -> dict[str, dict[str, Any]]:
    try:
        value = json.loads((home / FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in value.items() if isinstance(v, dict)} if isinstance(value, dict) else {}


def _write(home: Path, value: dict[str, dict[str, Any]]) -> None:
    write_private(home / FILE, json.dumps(value, indent=1, sort_keys=True) + "\n")


def record(home: Path, job_id: str, controller: str) -> None:
    """``job_id`` is managed by the controller on ``controller``."""
    known = _read(home)
    known[job_id] = {"controller": controller}
    _write(home, known)


def managed(home: Path, job_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The managed jobs among ``job_ids``, each with what is known of it here."""
    known = _read(home)
    return {j: known[j] for j in job_ids if j in known}


def refresh(inventory: Inventory, registry: Registry, job_ids: Iterable[str], say: Say,
            force: bool = False) -> dict[str, dict[str, Any]]:
    """The managed jobs among ``job_ids``, brought up to date from their controller when one of
    them is not finished here (``force``: always); moves applied to the registry."""
    from orchestrator.controller.client import Controller

    home = inventory.home
    mine = managed(home, job_ids)
    ask = {info["controller"] for j, info in mine.items()
           if force or registry.get(j).state not in TERMINAL or info.get("phase") != "done"}
    known = _read(home)
    for where in sorted(ask):
        try:
            with Controller(inventory.get(where), inventory, say) as ctl:
                reply = ctl.status()
        except OrchError as exc:
            say(f"warning: the controller on {where} does not answer ({str(exc).splitlines()[0]}): its managed jobs "
                "are asked of their hosts")
            continue
        if not reply.get("running"):
            say(f"warning: the controller on {where} is down: its managed jobs are not watched (orch controller up "
                f"{where})")
            continue
        for job in reply.get("jobs") or []:
            job_id = job.get("job_id")
            if job_id not in mine:
                continue
            _follow_move(registry, {"local", *inventory.names()}, job_id, job, say)
            known[job_id] = {"controller": where, **{k: job.get(k) for k in (
                "hosts", "recoveries", "phase", "state", "note", "job_dir")}}
    _write(home, known)
    return {j: known[j] for j in mine}


def _follow_move(registry: Registry, known: set[str], job_id: str, job: dict[str, Any], say: Say) -> None:
    """The controller moved ``job_id``: the laptop's registry follows, fencing what it left —
    when this laptop knows the new hosts (not a box the controller rented for itself)."""
    hosts, job_dir = job.get("hosts"), job.get("job_dir")
    if not (isinstance(hosts, list) and hosts and isinstance(job_dir, str)):
        return
    if not set(map(str, hosts)) <= known:
        return
    now = registry.get(job_id)
    if now.hosts == hosts:
        return
    registry.move(job_id, [str(h) for h in hosts], job_dir, {},
                  superseded=[(name, now.job_dir) for name in now.hosts])
    say(f"{job_id}: the controller moved it from {', '.join(now.hosts)} to {', '.join(hosts)}")


def words(info: dict[str, Any]) -> str:
    """One line on a managed job for ``orch status``."""
    line = f"managed by the controller on {info.get('controller')}"
    if info.get("hosts"):
        line += f": on {', '.join(info['hosts'])}"
    if info.get("recoveries"):
        line += f", recovered {info['recoveries']}x"
    if info.get("note"):
        line += f" ({info['note']})"
    return line


def stop(inventory: Inventory, job_id: str, say: Say) -> None:
    """``orch cancel`` of a managed job: its controller stops managing it first (a warning when
    it does not answer: the cancel goes on)."""
    from orchestrator.controller.client import Controller

    info = managed(inventory.home, [job_id]).get(job_id)
    if info is None:
        return
    where = info["controller"]
    try:
        with Controller(inventory.get(where), inventory, say) as ctl:
            ctl.ask({"op": "cancel", "job_id": job_id})
    except OrchError as exc:
        say(f"warning: the controller on {where} was not told ({str(exc).splitlines()[0]}): it may still recover "
            f"{job_id}; orch cancel {job_id} again once it answers")
        return
    say(f"{job_id}: no longer managed (the controller on {where} was told)")


def fetch_from_controller(inventory: Inventory, job_id: str, dest: Path, say: Say) -> tuple[Path, int]:
    """The copy the controller kept of ``job_id`` (its outputs, logs, metrics, latest checkpoint),
    into ``dest/<job_id>/``; (that folder, files written). ``UsageError`` when the job is not managed."""
    from orchestrator.controller.client import Controller

    info = managed(inventory.home, [job_id]).get(job_id)
    if info is None:
        raise UsageError(f"{job_id} is not a managed job")
    where = info["controller"]
    target = dest / job_id
    target.mkdir(parents=True, exist_ok=True)
    with Controller(inventory.get(where), inventory, say) as ctl:
        count = ctl.pull(job_id, lambda stream: _untar(stream, target))
    say(f"fetched {job_id} from the controller on {where} (its box does not answer)")
    return target, count


def _untar(stream: Any, target: Path) -> int:
    count = 0
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            if not (member.isfile() or member.isdir()):
                continue
            tar.extract(member, target, filter="data")
            count += member.isfile()
    return count

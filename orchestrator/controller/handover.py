"""A managed job handed to the controller (``orch submit`` with ``recovery:`` or ``--managed``).

``check`` runs before the submit (nothing starts when the job cannot be managed); ``hand_over``
after it: the controller gets the job's registry row, the host entries it may use (the job's
hosts and ``recovery.hosts``, each with its identity file's key, which the controller keeps
0600 in its own ORCH_HOME as this laptop keeps it in ~/.ssh), the recovery rules and where the
webhook goes; the secret values it needs (the job's ``secret_env``, host passwords, provider
tokens, a webhook's ``url_env``) go to its memory only, read from this laptop's environment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from orchestrator.controller import laptop
from orchestrator.controller.client import Controller, recorded_host
from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import Host, Inventory
from orchestrator.spec.model import Recovery
from orchestrator.state.registry import Registry

Say = Callable[[str], None]


def recovery_of(spec: Any, managed: bool) -> Recovery | None:
    """The job's recovery rules: its ``recovery:``, or the defaults under ``--managed``; None: not managed."""
    if spec.recovery is not None:
        return spec.recovery
    return Recovery() if managed else None


def check(spec: Any, inventory: Inventory, recovery: Recovery) -> str:
    """The controller's host; ``UsageError`` (exit 2) when the job cannot be managed: no
    controller yet, a host the controller cannot reach (this laptop's ``local``), an unknown
    recovery host."""
    where = recorded_host(inventory.home)
    if where is None:
        raise UsageError("a managed job (recovery: or --managed) needs a controller: start one with "
                         "`orch controller up HOST` first (docs/managed.md)")
    names = [ref if isinstance(ref, str) else ref.name for ref in spec.hosts]
    if "local" in names or "local" in recovery.hosts:
        raise UsageError("a managed job runs on hosts the controller reaches over SSH: `local` is this laptop's "
                         "(docs/managed.md)")
    for name in recovery.hosts:
        inventory.get(name)  # an unknown name: UsageError naming the known ones
    return where


def secret_names(record_secrets: list[str], hosts: list[Host], spec: Any, recovery: Recovery) -> list[str]:
    names = list(record_secrets)
    names += [h.password_env for h in hosts if h.password_env]
    names += [h.provider.token_env for h in hosts if h.provider is not None]
    if recovery.rent is not None:
        from orchestrator.providers.registry import PROVIDERS

        names.append(recovery.rent.token_env or PROVIDERS[recovery.rent.provider].token_env)
    notify = spec.on_finish.notify
    if notify is not None and notify.url_env:
        names.append(notify.url_env)
    return sorted(set(names))


def hand_over(job_id: str, spec: Any, recovery: Recovery, inventory: Inventory, registry: Registry,
              say: Say) -> dict[str, Any]:
    """Hand the started job ``job_id`` to the controller; its answer. ``RemoteError`` when it
    does not take it (the job runs on, unmanaged: the message says so)."""
    where = check(spec, inventory, recovery)
    record = registry.get(job_id)
    hosts = [inventory.get(name) for name in dict.fromkeys([*record.hosts, *recovery.hosts])]
    keys = {h.name: Path(h.identity_file).expanduser().read_text() for h in hosts if h.identity_file}
    names = secret_names(record.secret_env, hosts, spec, recovery)
    notify = spec.on_finish.notify
    request = {
        "op": "manage",
        "record": {"job_id": record.job_id, "name": record.name, "spec_path": record.spec_path,
                   "hosts": record.hosts, "job_dir": record.job_dir, "state": record.state,
                   "detail": record.detail, "secret_env": record.secret_env},
        "hosts": [h.model_dump(mode="json") for h in hosts], "keys": keys,
        "recovery": recovery.model_dump(mode="json"),
        "notify": notify.model_dump(mode="json") if notify is not None else None,
        "secrets": {n: os.environ[n] for n in names if os.environ.get(n)}, "names": names,
    }
    with Controller(inventory.get(where), inventory, say) as ctl:
        reply = ctl.ask(request)
    laptop.record(inventory.home, job_id, where)
    say(f"{job_id} is managed by the controller on {where} (orch controller status)")
    return reply

"""Submit (connect → hello → plan → sync → launch), cancel and resume a job.

``submit`` never starts a job twice: the job id is made once per call, and the agent
refuses an id that already exists on the host.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable

from orchestrator import sync as syncmod
from orchestrator.connect import ask_on_tty, open_transport
from orchestrator.errors import RemoteError, UsageError
from orchestrator.hosts import Host, Inventory
from orchestrator.plan import GRACE_S, HostFacts, Plan, build_plan, make_job_id
from orchestrator.registry import SUBMITTING, JobRecord, Registry
from orchestrator.remote import Remote
from orchestrator.spec import LoadedSpec
from orchestrator.testhooks import pause

Say = Callable[[str], None]


@dataclass(frozen=True)
class Submitted:
    plan: Plan
    sync_summary: dict[str, Any] | None
    warnings: list[str]


def submit(loaded: LoadedSpec, inventory: Inventory, registry: Registry, *, say: Say,
           dry_run: bool = False, force: bool = False, trust: Callable[[str], bool] = ask_on_tty) -> Submitted:
    spec = loaded.spec
    hosts = [inventory.resolve(ref) for ref in spec.hosts]
    if len(hosts) > 1:
        raise UsageError("jobs across several hosts are not supported yet: list one host")
    host = hosts[0]
    workspace = loaded.workspace_dir
    files = syncmod.select_files(workspace, spec.workspace.exclude)
    warnings = syncmod.warnings_for(files)
    project = syncmod.project_name(workspace)
    say(f"connecting to {host.name} ({host.target})")
    with open_transport(host, inventory, trust) as transport:
        remote = Remote(host, transport)
        hello = remote.call("hello", project, "--gpus")
        facts = HostFacts.model_validate({k: hello.get(k) for k in HostFacts.model_fields if k in hello})
        key = submission_key(loaded, hosts)
        earlier = registry.unconfirmed(key)
        job_id = earlier.job_id if earlier else make_job_id(spec.name, datetime.now(), os.urandom(8))
        plan = build_plan(spec, loaded.text, str(workspace), project, hosts, [facts], job_id)
        if dry_run:
            return Submitted(plan, None, warnings)
        for warning in warnings:
            say(f"warning: {warning}")
        sync_plan = syncmod.plan_sync(workspace, files, hello.get("sync", {}), force)
        say(f"syncing {len(sync_plan.send)} changed file(s), {sync_plan.send_bytes / 2**20:.1f} MB"
            f"{f', deleting {len(sync_plan.delete)}' if sync_plan.delete else ''}")
        registry.add(job_id, spec.name, str(loaded.path), [h.name for h in hosts], plan.job_dir, SUBMITTING,
                     {"submission": key})
        summary = syncmod.send(remote, project, workspace, sync_plan)
        pause("after-sync")
        request = {"job": plan.job_json(), "train": plan.train, "project": project, "node_rank": 0}
        proc = remote.start("launch")
        proc.write(json.dumps(request).encode())
        pause("launch-sent")  # the server holds the whole request; it acts on EOF, even a dropped link's
        proc.close_stdin()
        reply = remote.finish(proc, "launch")
        if reply.get("existing"):
            say(f"{job_id} was already started by an interrupted submit of this file: not started twice")
        else:
            say(f"started {job_id} on {host.name}")
        registry.update(job_id, "pending", {})
        return Submitted(plan, summary, warnings)


def submission_key(loaded: LoadedSpec, hosts: list[Host]) -> str:
    """Identifies "the same submission": this spec file, this text, these hosts. A submit
    cut off before the laptop saw the launch confirmed reuses its job id, so a rerun can
    never start the job twice."""
    material = "\0".join([str(loaded.path), loaded.text, *(h.name for h in hosts)])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def job_host(record: JobRecord, inventory: Inventory) -> Host:
    return inventory.get(record.hosts[0])


def probe(record: JobRecord, inventory: Inventory, registry: Registry, remote: Remote | None = None) -> dict[str, Any]:
    """Ask the host for the job's status (one round trip) and cache it in the registry."""
    if remote is None:
        host = job_host(record, inventory)
        with open_transport(host, inventory) as transport:
            return probe(record, inventory, registry, Remote(host, transport))
    status = remote.call("status", record.job_id)["jobs"][record.job_id]
    if not isinstance(status, dict) or not isinstance(status.get("state"), str):
        raise RemoteError(f"{remote.host.name}: unreadable status for {record.job_id}")
    registry.update(record.job_id, status["state"], status)
    return status


def cancel(record: JobRecord, inventory: Inventory, registry: Registry, grace: float = GRACE_S) -> dict[str, Any]:
    host = job_host(record, inventory)
    with open_transport(host, inventory) as transport:
        status = Remote(host, transport).call("cancel", record.job_id, str(grace), timeout=grace + 120)
    registry.update(record.job_id, status["state"], status)
    return status


def resume(record: JobRecord, inventory: Inventory, registry: Registry) -> dict[str, Any]:
    host = job_host(record, inventory)
    with open_transport(host, inventory) as transport:
        remote = Remote(host, transport)
        reply = remote.call("resume", record.job_id)
        registry.update(record.job_id, "pending", {})
    return reply

"""Submit one job, or run an earlier one again: a batch of one through the submit sequence
(``pipeline.py``). ``checked_submit`` is ``orch submit``'s and the Python API's: ``orch
check``'s laptop checks first, then ``submit``.

``submit`` never starts a job twice: the job id is reserved in the registry under a
submission key before anything is sent, a rerun of an interrupted submit reuses it, and the
agent refuses an id that already exists on the host. A live submit holds its key
(``state/inflight.py``), so a second submit of the same file at the same time is refused
rather than taking its reservation. Each node's code is set apart as it is sent
(``sync.send`` with ``SyncPlan.stage``) and launched from there: what a job runs is what its
own submit sent. A resubmit that changed nothing (its selection is the record the laptop holds
of the host's) has it set apart from the server's record in ``hello`` instead: no receive. How
a submit that stopped ended is decided in ``outcome.py``.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from orchestrator import trace
from orchestrator.access.connect import ask_on_tty
from orchestrator.checks.laptop import laptop_report
from orchestrator.errors import UsageError
from orchestrator.helper.remote import Remote
from orchestrator.hosts.inventory import Inventory
from orchestrator.jobs import secrets
from orchestrator.jobs.pipeline import Batch, HostSet, Say, Unit, claim, run_batch, submission_key
from orchestrator.plan import slurm as slurmplan
from orchestrator.plan.build import Plan, make_job_id
from orchestrator.spec.load import LoadedSpec, parse_spec
from orchestrator.state import runs
from orchestrator.state.registry import JobRecord, Registry
from orchestrator.sync import excluded
from orchestrator.sync import selection


@dataclass(frozen=True)
class Submitted:
    """What a submit did: the job's plan, what the sync moved, the warnings said with the plan."""

    plan: Plan
    sync_summary: dict[str, Any] | None
    warnings: list[str]
    remotes: dict[str, Remote] = field(default_factory=dict)  # by host name, open while ``keep`` is
    selection: dict[str, Any] | None = None  # files, bytes, and what the ignore rules left out (excluded.Summary)

    def as_json(self) -> dict[str, Any]:
        """The new job as ``orch submit --json`` prints it (before a follow adds how it ended)
        and the Python API's ``Job`` holds it: its id, hosts and folder, ``pending``, what the
        sync moved and what the ignore rules left out."""
        plan = self.plan
        return {"job_id": plan.job_id, "hosts": [n.host for n in plan.nodes], "job_dir": plan.job_dir,
                "state": "pending", "sync": self.sync_summary,
                "excluded": self.selection["excluded"] if self.selection else None}


def checked_submit(loaded: LoadedSpec, inventory: Inventory, registry: Registry, *, say: Say,
                   dry_run: bool = False, force: bool = False, pull_remote_edits: bool = False,
                   trust: Callable[[str], bool] = ask_on_tty, keep: ExitStack | None = None) -> Submitted:
    """``orch check``'s laptop checks (``checks/laptop.py``: ``laptop_report``, its errors
    raised before anything connects, each warning said as ``warning: ...``), then ``submit``
    on the same walk of the workspace: the submit of ``orch submit`` and the Python API."""
    chosen = selection.Chosen(loaded.workspace_dir, loaded.spec.workspace.exclude)  # one walk: checks and sync
    for warning in laptop_report(loaded, chosen):
        say(f"warning: {warning}")
    trace.mark("spec", f"{loaded.where or loaded.path} read and checked")
    return submit(loaded, inventory, registry, say=say, dry_run=dry_run, force=force,
                  pull_remote_edits=pull_remote_edits, trust=trust, keep=keep, chosen=chosen)


def submit(loaded: LoadedSpec, inventory: Inventory, registry: Registry, *, say: Say, dry_run: bool = False,
           force: bool = False, pull_remote_edits: bool = False,
           trust: Callable[[str], bool] = ask_on_tty, keep: ExitStack | None = None,
           chosen: selection.Chosen | None = None) -> Submitted:
    """Submit the job. ``keep``: the connections stay open until that stack closes (the
    ``Submitted.remotes`` serve ``--follow``); without it they close on return. ``chosen``:
    the workspace's selection when the caller's checks walked it already."""
    spec = loaded.spec
    hosts = [inventory.resolve(ref) for ref in spec.hosts]
    slurmplan.check_hosts(loaded, hosts)
    secrets.read(spec.secret_env, "orch submit")  # a missing one stops it before anything connects
    workspace = loaded.workspace_dir
    if chosen is None or chosen.root != workspace or chosen.exclude != list(spec.workspace.exclude):
        chosen = selection.Chosen(workspace, spec.workspace.exclude)
    files, skipped = chosen.files(), chosen.skipped
    trace.mark("selection", f"{len(files)} file(s) chosen in {workspace}")
    warnings = selection.warnings_for(files, skipped)
    project = selection.project_name(workspace)
    left_out = excluded.summarize(workspace, skipped)
    chosen = {"files": len(files), "bytes": sum(f.size for f in files.values()), "excluded": left_out.as_json()}
    if dry_run:
        say(f"would sync {len(files)} file(s), {chosen['bytes'] / 2**20:.1f} MB from {workspace}; "
            + ("never synced (written by orch fetch/plot): " + runs.describe(skipped.orch_dirs) if skipped.orch_dirs else
               f"folders orch writes (fetch/plot results, marked {runs.MARKER}) are never synced"))
    for line in left_out.lines():
        say(line)
    key = submission_key(loaded, hosts)
    with ExitStack() as lease, ExitStack() as stack:
        if not dry_run:  # before anything is sent: a second live submit of this very file is refused
            claim(lease, key, loaded, registry)
        say("connecting to " + ", ".join(f"{h.name} ({h.target})" for h in hosts))
        earlier = registry.unconfirmed(key)  # left by a submit that is over: this one holds the key
        job_id = earlier.job_id if earlier else make_job_id(spec.name, datetime.now(), os.urandom(8))
        stages = {h.name: f"{job_id}-{rank}" for rank, h in enumerate(hosts)}  # each node's code, set apart as sent
        connections = HostSet(inventory, registry, trust, stack)
        connections.open(hosts, project, stages, None if dry_run else (lambda recorded: selection.same_as_record(
            files, recorded)))
        down = connections.first_down([h.name for h in hosts])
        if down is not None:
            raise down
        batch = Batch([Unit(0, loaded, tuple(hosts), job_id, key)], connections, project, files, stages, say,
                      lone=True, force=force, pull_remote_edits=pull_remote_edits, dry_run=dry_run,
                      reused=frozenset([job_id] if earlier else []))
        batch.result.warnings += warnings  # said with the plan's
        done = run_batch(batch)
        plan = done.plans[0]
        if dry_run:
            return Submitted(plan, None, done.warnings, selection=chosen)
        lease.close()  # launched: the same file submitted again from now on is a new job
        if keep is not None:
            keep.push(stack.pop_all())
        return Submitted(plan, done.sync_summary, done.warnings,
                         dict(connections.remotes) if keep is not None else {}, chosen)


def rerun(record: JobRecord, inventory: Inventory, registry: Registry, *, say: Say,
          trust: Callable[[str], bool] = ask_on_tty) -> Plan:
    """Submit an earlier job again as a new job: the spec text it recorded and its own code
    snapshot (hard-linked on each host), not today's workspace."""
    with ExitStack() as stack:
        connections = HostSet(inventory, registry, trust, stack)
        first = inventory.get(record.hosts[0])
        connections.connect([first])
        if first.name in connections.down:
            raise connections.down[first.name][2]
        shown = connections.remotes[first.name].call("show", job=record.job_id)
        if not isinstance(shown.get("spec_text"), str):
            raise UsageError(f"{record.job_id} has no recorded spec on {first.name}: it cannot be rerun")
        loaded = parse_spec(shown["spec_text"], Path(record.spec_path))
        secrets.recorded(loaded.spec.secret_env, record, f"orch rerun {record.job_id}")
        hosts = [inventory.resolve(ref) for ref in loaded.spec.hosts]
        project = selection.project_name(loaded.workspace_dir)
        connections.open(hosts, project)
        down = connections.first_down([h.name for h in hosts])
        if down is not None:
            raise down
        job_id = make_job_id(loaded.spec.name, datetime.now(), os.urandom(8))
        batch = Batch([Unit(0, loaded, tuple(hosts), job_id, "", rerun_of=record.job_id)], connections, project, {},
                      {}, say, lone=True)
        return run_batch(batch).plans[0]

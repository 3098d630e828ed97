"""Submit a sweep's jobs on shared connections (docs/sweeps.md).

One connection and one ``hello`` per host of the pool; every combination's plan is made
before anything is sent (a plan that cannot be made — more processes than GPUs — stops the
sweep with nothing synced); every job id is reserved in the registry with its sweep entry;
the workspace is synced once per host; then the jobs are launched one after another, one
``say`` line each. A submit cut off part-way is continued by running it again with the same
``--sweep-name``: combinations already launched are skipped, and one reserved but not
confirmed reuses its job id (``launch.submission_key``), so no job starts twice.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from typing import Callable

from orchestrator.access.connect import ask_on_tty
from orchestrator.checks import slurm as slurmcheck
from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import Host, Inventory
from orchestrator.jobs import record as repro
from orchestrator.jobs import secrets
from orchestrator.jobs.nodes import parallel
from orchestrator.jobs.submit import Say, checked_plan, connect_all, plan_syncs, start_nodes, submission_key
from orchestrator.plan import slurm as slurmplan
from orchestrator.plan.build import Plan, make_job_id
from orchestrator.state.registry import SUBMITTING, Registry, SweepEntry
from orchestrator.sweep.expand import Combination
from orchestrator.sync import record as synccache
from orchestrator.sync import selection
from orchestrator.sync import send as transfer
from orchestrator.testhooks import pause


@dataclass(frozen=True)
class SweepJob:
    """A combination, its plan and job id; ``skipped``: launched by an earlier submit of this
    sweep (``state`` is then its recorded state); ``key``: its submission key."""

    combo: Combination
    plan: Plan | None
    job_id: str
    skipped: bool = False
    state: str = "pending"
    key: str = ""


def entry_for(name: str, combo: Combination) -> SweepEntry:
    return SweepEntry(name, combo.index, combo.total, [[k, v, text] for k, v, text in combo.values])


def earlier_jobs(registry: Registry, name: str, combos: list[Combination]) -> dict[int, tuple[str, str]]:
    """{combination: (job id, state)} of the jobs an earlier submit of sweep ``name`` made;
    ``UsageError`` when that sweep holds other combinations (a name names one sweep)."""
    found: dict[int, tuple[str, str]] = {}
    wanted = {(c.index, c.total, repr([[k, v] for k, v, _ in c.values])): c for c in combos}
    for record, entry in registry.sweep_jobs(name):
        key = (entry.combination, entry.combinations, repr([v[:2] for v in entry.values]))
        if key not in wanted:
            raise UsageError(f"sweep {name} already holds other combinations (combination {entry.combination}: "
                             f"{', '.join(f'{k}={t}' for k, t in entry.pairs())}, {record.job_id}): choose another "
                             "--sweep-name")
        if record.state != SUBMITTING:
            found[entry.combination] = (record.job_id, record.state)
    return found


def submit_sweep(name: str, combos: list[Combination], inventory: Inventory, registry: Registry, *, say: Say,
                 dry_run: bool = False, force: bool = False, pull_remote_edits: bool = False,
                 trust: Callable[[str], bool] = ask_on_tty) -> list[SweepJob]:
    """Submit every combination not launched yet (see the module docstring); the jobs in
    combination order, those launched by an earlier submit marked ``skipped``."""
    first = combos[0].loaded
    done = earlier_jobs(registry, name, combos)
    hosts: dict[str, Host] = {}
    for combo in combos:
        host = hosts.get(combo.host) or inventory.resolve(combo.loaded.spec.hosts[0])
        slurmplan.check_hosts(combo.loaded, [host])
        secrets.read(combo.loaded.spec.secret_env, "orch submit")  # before anything connects
        hosts[combo.host] = host
    todo = [c for c in combos if c.index not in done]
    for combo in combos:
        if combo.index in done:
            say(f"combination {combo.index} ({combo.label}) is {done[combo.index][0]} "
                f"({done[combo.index][1]}), launched by an earlier submit of sweep {name}: skipped")
    jobs = {c.index: SweepJob(c, None, done[c.index][0], True, done[c.index][1]) for c in combos if c.index in done}
    if not todo:
        return [jobs[c.index] for c in combos]
    pool = [hosts[n] for n in dict.fromkeys(c.host for c in todo)]
    workspace = first.workspace_dir
    skipped = selection.Skipped()
    files = selection.select_files(workspace, first.spec.workspace.exclude, skipped)
    warnings = selection.warnings_for(files, skipped)
    project = selection.project_name(workspace)
    say(f"sweep {name}: {len(todo)} job(s) on " + ", ".join(f"{h.name} ({h.target})" for h in pool))
    with ExitStack() as stack:
        remotes = dict(zip((h.name for h in pool), connect_all(pool, inventory, trust, stack)))
        hellos = dict(zip(remotes, parallel(lambda r: synccache.hello(r, project, gpus=True), list(remotes.values()))))
        for combo in todo:
            remote, hello = remotes[combo.host], hellos[combo.host]
            key = submission_key(combo.loaded, [remote.host])
            earlier = registry.unconfirmed(key)
            job_id = earlier.job_id if earlier else make_job_id(combo.loaded.spec.name, datetime.now(), os.urandom(8))
            plan, more = checked_plan(combo.loaded, project, [remote], [hello], job_id)
            warnings += [f"combination {combo.index}: {w}" for w in more]
            jobs[combo.index] = SweepJob(combo, plan, job_id, key=key)
        for warning in dict.fromkeys(warnings):
            say(f"warning: {warning}")
        if dry_run:
            return [jobs[c.index] for c in combos]
        names = list(remotes)
        sync_plans = plan_syncs([remotes[n] for n in names], [hellos[n] for n in names], first, files, project,
                                force, pull_remote_edits, say)
        for combo in todo:
            job = jobs[combo.index]
            assert job.plan is not None
            registry.add(job.job_id, combo.loaded.spec.name, str(combo.loaded.path), [combo.host], job.plan.job_dir,
                         SUBMITTING, {"submission": job.key, **slurmcheck.log_nodes(job.plan)},
                         sweep=entry_for(name, combo), secret_env=job.plan.secret_env)
        parallel(lambda i: transfer.send(remotes[names[i]], project, workspace, sync_plans[i]), range(len(names)))
        pause("after-sync")
        git = repro.git_state(workspace)
        started: list[int] = []
        try:
            for combo in todo:
                job = jobs[combo.index]
                assert job.plan is not None
                tell: Say = lambda m, c=combo: say(f"combination {c.index}/{c.total} ({c.label}): {m}")  # noqa: E731
                extra = {"project": project, "repro": repro.record(combo.loaded, git)}
                start_nodes([remotes[combo.host]], job.plan, extra, tell)
                registry.update(job.job_id, "pending", slurmcheck.log_nodes(job.plan))
                started.append(combo.index)
        except BaseException:
            left = [c.index for c in todo if c.index not in started]
            say(f"sweep {name}: combination(s) {', '.join(map(str, left))} not started; run the same command with "
                f"--sweep-name {name} to submit them (those started are skipped)")
            raise
    return [jobs[c.index] for c in combos]

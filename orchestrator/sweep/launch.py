"""Submit a sweep's jobs on shared connections (docs/sweeps.md).

One connection and one ``hello`` per host of the pool; every combination's plan is made
before anything is sent; the workspace is synced once per host; then the jobs are launched
one after another, one ``say`` line each.

Contracts:

- a failure of one host or one combination never stops the others: a host that cannot be
  reached, refuses the login, fails its ``hello``, its sync or (its link lost) a launch loses
  its own combinations only; a plan the host cannot run or a launch the host refuses loses
  that combination only; each is a ``Missed`` with the reason and the exit code of its cause;
  Ctrl-C stops the submit and every combination not launched yet is ``Missed`` (130);
- a job id is reserved (``SUBMITTING``) only right before its launch request, once its host
  has just answered; a launch that fails is settled at once by asking the host whether the
  job exists (confirmed, or the reservation removed); only when the host cannot be asked
  does the reservation stay, named in the ``Missed``;
- the same ``--sweep-name`` again skips the combinations already started (any state but
  ``SUBMITTING``) and settles each earlier reservation of a combination it submits by asking
  its host: there → it started (recorded, skipped); not there → removed; the host silent →
  the combination is not started anywhere else (it may run there) until that host answers
  or has been unreachable for ``ORCH_LOST_AFTER_S`` (then the reservation is recorded
  ``lost`` and the combination goes ahead);
- ``only``: the combinations to submit (``--only``; default all).
"""

from __future__ import annotations

import os
import textwrap
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

from orchestrator.access.connect import ask_on_tty
from orchestrator.errors import OrchError, UsageError
from orchestrator.checks.laptop import laptop_checks
from orchestrator.hosts.inventory import Host, Inventory
from orchestrator.jobs import secrets
from orchestrator.spec.load import LoadedSpec
from orchestrator.jobs.pipeline import Batch, HostSet, Say, Unit, claim, naming, run_batch, settle, submission_key
from orchestrator.plan import slurm as slurmplan
from orchestrator.plan.build import Plan, make_job_id
from orchestrator.state import inflight, reach
from orchestrator.state.registry import SUBMITTING, JobRecord, Registry, SweepEntry
from orchestrator.sweep.expand import Axis, Combination, check_each, check_name, default_name, expand, parse_only
from orchestrator.sync import selection
from orchestrator.transport import shell

INTERRUPTED = 130


@dataclass(frozen=True)
class SweepJob:
    """A combination, its plan and job id; ``skipped``: started by an earlier submit of this
    sweep (``state`` is then its recorded state); ``key``: its submission key."""

    combo: Combination
    plan: Plan | None
    job_id: str
    skipped: bool = False
    state: str = "pending"
    key: str = ""


@dataclass(frozen=True)
class Missed:
    """A combination this submit did not start: why (one line), the exit code of that cause
    (3 unreachable, 4 a step on the host failed, 2 refused, 130 interrupted), and the job id
    of a reservation left because its host could not be asked whether it started."""

    combo: Combination
    reason: str
    code: int
    job_id: str | None = None


@dataclass
class SweepResult:
    """What a submit of a sweep did: ``jobs`` started now or earlier (combination order),
    ``missed`` not started, ``answered`` the hosts that took every job sent to them."""

    name: str
    jobs: list[SweepJob] = field(default_factory=list)
    missed: list[Missed] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)
    interrupted: bool = False

    def exit_code(self) -> int:
        """0 when every combination asked for started (now or earlier); else 130 when
        interrupted, 3 when a host could not be reached, else the first missed one's code."""
        if not self.missed:
            return 0
        if self.interrupted:
            return INTERRUPTED
        codes = [m.code for m in self.missed]
        return 3 if 3 in codes else codes[0]


def entry_for(name: str, combo: Combination) -> SweepEntry:
    return SweepEntry(name, combo.index, combo.total, [[k, v, text] for k, v, text in combo.values])


def earlier_jobs(registry: Registry, name: str,
                 combos: list[Combination]) -> tuple[dict[int, tuple[str, str]], dict[int, list[JobRecord]]]:
    """({combination: (job id, state)} of the jobs an earlier submit of sweep ``name``
    started, {combination: its reservations (``SUBMITTING``)}); ``UsageError`` when that
    sweep holds other combinations (a name names one sweep)."""
    found: dict[int, tuple[str, str]] = {}
    reserved: dict[int, list[JobRecord]] = {}
    wanted = {(c.index, c.total, repr([[k, v] for k, v, _ in c.values])): c for c in combos}
    for record, entry in registry.sweep_jobs(name):
        key = (entry.combination, entry.combinations, repr([v[:2] for v in entry.values]))
        if key not in wanted:
            raise UsageError(f"sweep {name} already holds other combinations (combination {entry.combination}: "
                             f"{', '.join(f'{k}={t}' for k, t in entry.pairs())}, {record.job_id}): choose another "
                             "--sweep-name")
        if record.state == SUBMITTING:
            reserved.setdefault(entry.combination, []).append(record)
        else:
            found[entry.combination] = (record.job_id, record.state)
    return found, reserved


def _settle(hosts: HostSet, registry: Registry, record: JobRecord) -> str:
    """Settle an earlier submit's reservation: the answer of its host (``pipeline.settle``), or
    ``"lost"`` when its host has been unreachable for ``ORCH_LOST_AFTER_S`` (the reservation
    recorded lost)."""
    if inflight.holder(str(record.detail.get("submission", ""))) is not None:
        return "inflight"  # another live submit is launching it: never settled from here
    how = settle(hosts, record.hosts[0], record.job_id)
    if how != "unknown":
        return how
    name = record.hosts[0]
    seen = reach.get(registry.path, name)
    if reach.is_lost(seen):
        registry.update(record.job_id, "lost", {"reason": f"{reach.lost_reason(seen, record.job_id)} (its submit's "
                                                          "launch was cut off; the sweep started it elsewhere)"})
        return "lost"
    return "unknown"


def submit_sweep(name: str, combos: list[Combination], inventory: Inventory, registry: Registry, *, say: Say,
                 only: frozenset[int] | None = None, dry_run: bool = False, force: bool = False,
                 pull_remote_edits: bool = False, trust: Callable[[str], bool] = ask_on_tty) -> SweepResult:
    """Submit every combination of ``only`` (default all) not started yet, each host and each
    combination on its own (see the module docstring): a batch of one-host jobs through the
    submit sequence (``jobs/pipeline.py``), on one connection per host."""
    result = SweepResult(name)
    first = combos[0].loaded
    done, reserved = earlier_jobs(registry, name, combos)
    chosen = [c for c in combos if only is None or c.index in only]
    pool: dict[str, Host] = {}
    for combo in chosen:
        host = pool.get(combo.host) or inventory.resolve(combo.loaded.spec.hosts[0])
        slurmplan.check_hosts(combo.loaded, [host])
        secrets.read(combo.loaded.spec.secret_env, "orch submit")  # before anything connects
        pool[combo.host] = host
    todo = [c for c in chosen if c.index not in done]
    for combo in chosen:
        if combo.index in done:
            say(f"combination {combo.index} ({combo.label}) is {done[combo.index][0]} "
                f"({done[combo.index][1]}), started by an earlier submit of sweep {name}: skipped")
    jobs = {c.index: SweepJob(c, None, done[c.index][0], True, done[c.index][1]) for c in chosen if c.index in done}
    missed: dict[int, Missed] = {}
    if not todo:
        result.jobs = [jobs[c.index] for c in chosen]
        return result
    workspace = first.workspace_dir
    skipped = selection.Skipped()
    files = selection.select_files(workspace, first.spec.workspace.exclude, skipped)
    warnings = selection.warnings_for(files, skipped)
    project = selection.project_name(workspace)
    older = {r.hosts[0] for c in todo for r in reserved.get(c.index, [])}
    say(f"sweep {name}: {len(todo)} job(s) on " + ", ".join(f"{h.name} ({h.target})" for h in pool.values()
                                                            if any(c.host == h.name for c in todo)))
    by_index = {c.index: c for c in todo}
    batch: Batch | None = None
    with ExitStack() as stack:
        hosts = HostSet(inventory, registry, trust, stack)
        try:
            known = list(pool.values())
            for other in sorted(older - set(pool)):  # hosts of earlier reservations, asked whether they started
                try:
                    known.append(inventory.get(other))
                except OrchError as exc:
                    hosts.fail(other, exc)
            stages = {h.name: f"sweep-{os.urandom(6).hex()}-{i}" for i, h in enumerate(pool.values())}
            hosts.open([h for h in known if any(c.host == h.name for c in todo) or h.name in older], project, stages,
                       None if dry_run else (lambda recorded: selection.same_as_record(files, recorded)))
            ready = _settle_earlier(todo, reserved, hosts, registry, jobs, missed, say)
            units = []
            for combo in ready:
                host = pool[combo.host]
                key = submission_key(combo.loaded, [host])
                job_id = make_job_id(combo.loaded.spec.name, datetime.now(), os.urandom(8))
                if not dry_run and combo.host not in hosts.down:
                    try:  # a live submit of this very combination is refused, never joined
                        claim(stack, key, combo.loaded, registry)
                    except OrchError as exc:
                        missed[combo.index] = Missed(combo, naming(combo.host, exc), exc.exit_code)
                        continue
                units.append(Unit(combo.index, combo.loaded, (host,), job_id, key, entry_for(name, combo),
                                  tell=_teller(combo, say)))
            batch = Batch(units, hosts, project, files, stages, say, force=force, pull_remote_edits=pull_remote_edits,
                          dry_run=dry_run)
            batch.result.warnings += warnings
            run_batch(batch)
        except KeyboardInterrupt as exc:
            result.interrupted = True
            if str(exc):  # an interrupted sync says what each host kept
                say(f"interrupted: {exc}")
        if batch is not None:
            _gather(batch, by_index, jobs, missed)
        if result.interrupted:
            for combo in todo:
                if combo.index not in jobs and combo.index not in missed:
                    missed[combo.index] = Missed(combo, "interrupted (Ctrl-C) before its launch was confirmed",
                                                 INTERRUPTED)
        result.answered = [n for n in pool if n in hosts.remotes]
    result.jobs = [jobs[c.index] for c in chosen if c.index in jobs and c.index not in missed]
    result.missed = [missed[c.index] for c in chosen if c.index in missed]
    return result


def _settle_earlier(todo: list[Combination], reserved: dict[int, list[JobRecord]], hosts: HostSet,
                    registry: Registry, jobs: dict[int, SweepJob], missed: dict[int, Missed],
                    say: Say) -> list[Combination]:
    """Settle the earlier reservations of ``todo`` (``_settle``); the combinations still to
    launch. One that started after all joins ``jobs`` as skipped; one whose reservation
    cannot be settled joins ``missed``."""
    ready = []
    for combo in todo:
        outcomes = [(record, _settle(hosts, registry, record)) for record in reserved.get(combo.index, [])]
        started = [r for r, how in outcomes if how == "started"]
        silent = [r for r, how in outcomes if how == "unknown"]
        live = [r for r, how in outcomes if how == "inflight"]
        if started:
            state = registry.get(started[0].job_id).state
            say(f"combination {combo.index} ({combo.label}) is {started[0].job_id} ({state}): its launch by an "
                "earlier submit was cut off, but it started: skipped")
            jobs[combo.index] = SweepJob(combo, None, started[0].job_id, True, state)
        elif silent:
            where = silent[0].hosts[0]
            missed[combo.index] = Missed(
                combo, f"its launch on {where} (job {silent[0].job_id}) was cut off and {where} does not answer: it "
                       f"may run there, so it starts nowhere else until {where} answers or has been unreachable for "
                       f"{reach.span(reach.lost_after_s())}", 3, silent[0].job_id)
        elif live:
            missed[combo.index] = Missed(combo, f"another orch submit is launching it now (job {live[0].job_id})", 2,
                                         live[0].job_id)
        else:
            ready.append(combo)
    return ready


def _teller(combo: Combination, say: Say) -> Say:
    """``say`` headed by the combination: ``combination 2/4 (env.X=b): ...``."""
    return lambda m: say(f"combination {combo.index}/{combo.total} ({combo.label}): {m}")


def _gather(batch: Batch, combos: dict[int, Combination], jobs: dict[int, SweepJob],
            missed: dict[int, Missed]) -> None:
    """The batch's outcome per combination: launched ones (a dry run: planned ones) join
    ``jobs``, missed ones ``missed``."""
    done = batch.result
    started = done.plans if batch.dry_run else {i: done.plans[i] for i in done.launched}
    units = {u.index: u for u in batch.units}
    for index, plan in started.items():
        jobs[index] = SweepJob(combos[index], plan, units[index].job_id, key=units[index].key)
    for index, miss in done.missed.items():
        missed[index] = Missed(combos[index], miss.reason, miss.code, miss.job_id)


@dataclass(frozen=True)
class Prepared:
    """A sweep ready to submit: its ``name``, every combination (validated and checked as
    ``orch check`` checks a job file), the combinations to submit (``only``; None: all) and
    the host ``pool`` given instead of the job file's hosts (None: the file's)."""

    name: str
    combos: list[Combination]
    only: frozenset[int] | None
    pool: list[str] | None


def prepare(loaded: LoadedSpec, axes: list[Axis], overrides: list[Axis], inventory: Inventory, registry: Registry, *,
            name: str | None, only: str | None, hosts: str | None, say: Say) -> Prepared:
    """Expand the sweep (``expand``) with its name (``name``, else a new default one), the
    combinations ``only`` chooses (``--only`` text), on the pool ``hosts`` (``--hosts`` text),
    and check every combination before anything connects (``SpecError``/``UsageError``, exit
    2); an ``env.NAME`` key the job file's ``env:`` does not set is said as a likely typo."""
    sweep_name = check_name(name) if name else default_name(loaded.spec.name, lambda n: bool(registry.sweep_jobs(n)),
                                                            datetime.now())
    chosen = parse_only(only) if only is not None else None
    pool = [h.strip() for h in hosts.split(",")] if hosts is not None else None
    if pool is not None and (not all(pool) or len(set(pool)) != len(pool)):
        raise UsageError(f"--hosts {hosts!r}: give host names separated by commas, each once")
    refs = pool if pool is not None else loaded.spec.hosts
    slurm = frozenset(h.name for h in map(inventory.resolve, refs) if h.slurm)
    combos = expand(loaded, axes, overrides, sweep_name, slurm, pool, chosen)
    check_each(combos, laptop_checks)  # the same checks as `orch check`, on every combination
    for axis in axes:  # env.NAME may add a variable; one the job file does not set is often a typo
        if axis.key.startswith("env.") and axis.key[4:] not in loaded.spec.env:
            say(f"warning: {axis.key}: the job file's env: has no {axis.key[4:]} (a typo? set: "
                f"{', '.join(sorted(loaded.spec.env)) or 'none'}); each job gets it as a new variable")
    return Prepared(sweep_name, combos, chosen, pool)


def json_rows(result: SweepResult) -> list[dict[str, Any]]:
    """``orch submit --sweep --json``'s list: a row per combination started (now or earlier)
    or left out (``state`` ``not-started`` with its ``reason``), in combination order."""
    return sorted([{"job_id": j.job_id, "sweep": result.name, "combination": j.combo.index,
                    "combinations": j.combo.total, "values": {k: v for k, v, _ in j.combo.values},
                    "host": j.combo.host, "job_dir": j.plan.job_dir if j.plan else None, "state": j.state,
                    "skipped": j.skipped} for j in result.jobs]
                  + [{"job_id": m.job_id, "sweep": result.name, "combination": m.combo.index,
                      "combinations": m.combo.total, "values": {k: v for k, v, _ in m.combo.values},
                      "host": m.combo.host, "job_dir": None, "state": "not-started", "skipped": False,
                      "reason": m.reason} for m in result.missed], key=lambda r: r["combination"])


def missed_report(result: SweepResult, command: list[str], hosts_given: list[str] | None) -> str:
    """The message of a submit that left combinations out: the combinations of each reason
    (``#N (values), ...: reason``, wrapped at 80 columns), then the one command that submits
    exactly those: ``command`` (the submit as given, with ``--sweep-name``) plus ``--only``
    and, when a host of the pool did not answer and others did, ``--hosts`` of those that
    did (else the ``--hosts`` given)."""
    total = len(result.jobs) + len(result.missed)
    lines = [f"sweep {result.name}: {len(result.missed)} of {total} combination(s) not started:"]
    by_reason: dict[str, list[Missed]] = {}
    for m in result.missed:
        by_reason.setdefault(m.reason, []).append(m)
    for reason, group in by_reason.items():
        which = ", ".join(f"#{m.combo.index} ({m.combo.short_label()})" for m in group)
        lines += textwrap.wrap(f"{which}: {reason}", 80, initial_indent="  ", subsequent_indent="      ",
                               break_on_hyphens=False)
    unreachable = any(m.code == 3 for m in result.missed)
    pool = result.answered if unreachable and result.answered else hosts_given
    argv = [*command, "--only", ",".join(str(m.combo.index) for m in result.missed), *(["--hosts", ",".join(pool)]
                                                                                       if pool else [])]
    if unreachable and result.answered:
        lines.append(f"to submit exactly these on {', '.join(result.answered)} (without --hosts: on their own "
                     "hosts):")
    else:
        lines.append("to submit exactly these (--hosts H1,H2 puts them on other hosts):")
    return "\n".join(lines + ["  " + shell.join(argv)])

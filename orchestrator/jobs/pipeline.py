"""The one submit sequence: a batch of jobs over a shared set of host connections.

A lone job, a multi-node job, a sweep and a rerun all go through ``run_batch``:

    connect + hello (every host at once, each with its stage token: an unchanged resubmit has
    its code set apart in that same round trip) → plan each job (a Slurm host's checks) →
    rendezvous check (a multi-node job) → sync each host once → launch each job on the tree
    its host's sync (or hello) set apart → settle how each ended (``outcome.classify``) → a
    host with ``gc_keep_days`` collects (``reclaim.auto``).

Contracts:

- a job id is reserved (``SUBMITTING``) before anything is sent for it: a lone job (``Batch.lone``)
  right after its plan, so a rerun of an interrupted submit finds it under the same submission
  key and keeps its id (``submit.py``); a job of a larger batch (a sweep) right before its
  launch request, once its host has just answered, so an interrupted sweep leaves nothing to
  settle but what may have started;
- a lone job's first failure ends the submit: it is raised, recorded with its reservation by
  ``outcome.recorded`` when one was made; a batch of several keeps going past one host's or one
  job's failure: a host that fails its connect, hello, sync or (its link lost) a launch loses its
  own jobs only, a plan or launch the host refuses loses that job only — each a ``Missed`` with
  the reason, the exit code of its cause and its ``outcome.Ending``; a launch that fails is
  settled at once by asking the host whether the job exists (confirmed, or the reservation
  removed); when the host cannot be asked the reservation stays, its ending recorded (what
  ``orch status`` says of it) and its id named in the ``Missed``;
- every code tree a host's sync sets apart is taken by the last job launched there (``last``);
  one no launch took is removed by the host after a day.
"""

from __future__ import annotations

import hashlib
import threading
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from orchestrator import settings, trace
from orchestrator.access.connect import open_transport
from orchestrator.checks import slurm as slurmcheck
from orchestrator.errors import HostError, OrchError, RemoteError, SpecError, UsageError
from orchestrator.helper.remote import Remote, helper_argv
from orchestrator.hosts.inventory import Host, Inventory
from orchestrator.jobs import launchconfig, outcome, reclaim
from orchestrator.jobs import record as repro
from orchestrator.jobs import secrets
from orchestrator.jobs.nodes import parallel
from orchestrator.plan import budget, hidden
from orchestrator.plan.build import HostFacts, Plan, build_plan
from orchestrator.spec.load import LoadedSpec
from orchestrator.state import inflight, reach
from orchestrator.state.registry import SUBMITTING, Registry, SweepEntry
from orchestrator.sync import record as synccache
from orchestrator.sync import selection
from orchestrator.sync import send as transfer
from orchestrator.testhooks import pause

Say = Callable[[str], None]
LISTEN_S = 30.0


def submission_key(loaded: LoadedSpec, hosts: list[Host]) -> str:
    """Identifies "the same submission": this spec file, this text, these hosts. A submit
    cut off before the laptop saw the launch confirmed reuses its job id, so a rerun can
    never start the job twice."""
    material = "\0".join([str(loaded.path), loaded.text, *(h.name for h in hosts)])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def naming(host: str, exc: BaseException) -> str:
    """The error's first line, headed by ``host`` unless it names it already."""
    line = first_line(exc)
    return line if host in line else f"{host}: {line}"


class HostSet:
    """The hosts one submit talks to, each on its own: a connection (kept by ``stack``) and a
    ``hello`` per host that answered; the first failure of each that did not (``down``: its
    one-line reason, exit code and the error itself). Never raises an ``OrchError`` of a host:
    the caller decides whether one host's failure ends the submit."""

    def __init__(self, inventory: Inventory, registry: Registry, trust: Callable[[str], bool], stack: ExitStack) -> None:
        self.inventory, self.registry, self.trust, self.stack = inventory, registry, trust, stack
        self.remotes: dict[str, Remote] = {}
        self.hellos: dict[str, dict[str, Any]] = {}
        self.down: dict[str, tuple[str, int, OrchError]] = {}
        self.lock = threading.Lock()

    def connect(self, hosts: list[Host]) -> None:
        """Connect to ``hosts`` at once (no ``hello``)."""
        parallel(self._connect_one, hosts)

    def open(self, hosts: list[Host], project: str, stages: dict[str, str] | None = None,
             unchanged: Callable[[dict[str, Any]], bool] | None = None) -> None:
        """Connect to ``hosts`` and say ``hello`` for ``project`` on each, all at once;
        ``stages``: each host's stage token, under which ``hello`` sets the server's record
        apart when ``unchanged(record)`` says the laptop's selection is exactly it."""
        stages = stages or {}

        def one(host: Host) -> None:
            if host.name not in self.remotes and not self._connect_one(host):
                return
            self.greet(host.name, project, stages.get(host.name), unchanged)

        parallel(one, hosts)

    def _connect_one(self, host: Host) -> bool:
        try:
            transport = open_transport(host, self.inventory, self.trust, warm=helper_argv(host))
        except OrchError as exc:
            self.fail(host.name, exc)
            return False
        with self.lock:
            self.stack.enter_context(transport)
            self.remotes[host.name] = Remote(host, transport)
        return True

    def greet(self, name: str, project: str, stage: str | None = None,
              unchanged: Callable[[dict[str, Any]], bool] | None = None) -> None:
        """``hello`` on host ``name`` (connected) for ``project`` (``synccache.hello``)."""
        remote = self.remotes.get(name)
        if remote is None:
            return
        try:
            hello = synccache.hello(remote, project, gpus=True, stage=stage, unchanged=unchanged)
        except OrchError as exc:
            self.fail(name, exc)
            return
        reach.record(self.registry.path, name, ok=True)
        with self.lock:
            self.hellos[name] = hello

    def fail(self, name: str, exc: OrchError) -> None:
        """``name`` is out of this submit from now on (its first failure is kept)."""
        with self.lock:
            self.remotes.pop(name, None)
            self.hellos.pop(name, None)
            if name in self.down:
                return
            self.down[name] = (naming(name, exc), exc.exit_code, exc)
        if isinstance(exc, HostError):
            reach.record(self.registry.path, name, ok=False, error=first_line(exc))

    def first_down(self, names: list[str]) -> OrchError | None:
        """The error of the first of ``names`` (in that order) that is out."""
        return next((self.down[n][2] for n in names if n in self.down), None)

    def job_state(self, name: str, job_id: str) -> dict[str, Any] | None:
        """The job's status on host ``name`` (None when the host has no such job); a failure
        to ask takes the host out (``fail``) and is raised."""
        try:
            status = self.remotes[name].call("status", jobs=[job_id])["jobs"][job_id]
        except OrchError as exc:
            self.fail(name, exc)
            raise
        return None if status.get("state") == "unknown" else status


def check_rendezvous(remotes: list[Remote], plan: Plan, say: Say) -> None:
    """Every other node can open a TCP connection to the rendezvous host:port (a short
    listener stands in for torchrun's store); raise naming the pair that cannot."""
    endpoint = plan.rdzv_endpoint
    assert endpoint is not None, "a multi-node plan has a rendezvous"
    host, _, port = endpoint.rpartition(":")
    listener = remotes[0].start("listen", port=int(port), seconds=LISTEN_S)
    line = b""
    while not line.endswith(b"\n") and len(line) < 4096:
        chunk = listener.read(1)
        if not chunk:  # the reply came instead: it says why there is no listener
            remotes[0].finish(listener, "listening for the rendezvous")
            raise RemoteError(f"{remotes[0].host.name}: cannot listen for the rendezvous on port {port}")
        line += chunk
    try:
        checks = parallel(lambda r: r.call("tcp_check", host=host, port=int(port)), remotes[1:])
    finally:
        listener.close_stdin()
        remotes[0].finish(listener, "listening for the rendezvous")
    for remote, check in zip(remotes[1:], checks):
        if not check.get("ok"):
            raise RemoteError(
                f"node {remote.host.name} cannot reach the rendezvous {endpoint} on {remotes[0].host.name}: "
                f"{check.get('reason')}. Set launch.rdzv_host to an address the nodes share (a private network)."
            )
    say(f"every node reaches the rendezvous {endpoint}")


def checked_plan(loaded: LoadedSpec, project: str, remotes: list[Remote], hellos: list[dict[str, Any]],
                 job_id: str) -> tuple[Plan, list[str]]:
    """``plan_for`` with a Slurm host's checks: Slurm answers there (before its facts shape the
    plan), and the cluster can ever run the request (``slurmcheck``; both raise); returns the
    plan and the warnings to say (also what ``hidden.check_warnings`` says of a launcher inside
    the command)."""
    for remote, hello in zip(remotes, hellos):
        if remote.host.slurm:
            slurmcheck.cluster(remote.host, hello)
    plan = plan_for(loaded, project, remotes, hellos, job_id)
    said = hidden.check_warnings(loaded.spec, launchconfig.script(loaded.spec, Path(loaded.workspace_dir)),
                                 len(plan.nodes), plan.nodes[0].nproc)  # a launcher orch cannot run itself
    return plan, said + slurmcheck.job_problems(loaded.spec, [r.host for r in remotes], hellos, plan)


def plan_for(loaded: LoadedSpec, project: str, remotes: list[Remote], hellos: list[dict[str, Any]],
             job_id: str) -> Plan:
    """The plan from each node's ``hello``; a multi-node job without ``rdzv_port`` gets a
    free port on the first node. A ``max_cost`` that cannot be enforced on these hosts is a
    ``SpecError`` at the field's ``file:line:col`` (``plan/budget.py``)."""
    facts = [HostFacts.model_validate({k: h.get(k) for k in HostFacts.model_fields if k in h}) for h in hellos]
    port = None
    if len(remotes) > 1 and loaded.spec.launch.rdzv_port is None:
        port = remotes[0].call("free_port")["port"]
    hosts = [r.host for r in remotes]
    spec = launchconfig.counted(loaded.spec, Path(loaded.workspace_dir))
    script = launchconfig.script(loaded.spec, Path(loaded.workspace_dir))
    try:
        return build_plan(spec, loaded.text, str(loaded.workspace_dir), project, hosts, facts, job_id, port, script)
    except budget.Refused as exc:  # max_cost on hosts without a price: the job file's line
        raise SpecError(f"{loaded.locate(('max_cost',))}: max_cost: {exc}") from None
    except hidden.Refused as exc:  # a launcher inside the command that cannot be one world
        raise SpecError(f"{loaded.locate(('launch', 'command'))}: {exc}") from None


def staged_in_hello(hello: dict[str, Any]) -> bool:
    """``hello`` set this submit's code apart from the server's record (``synccache.hello``'s
    ``stage``; untrusted: only a count of staged files counts)."""
    answer = hello.get("sync", {}).get("staged")
    return isinstance(answer, dict) and isinstance(answer.get("staged"), int) and not isinstance(answer["staged"], bool)


def claim(lease: ExitStack, key: str, loaded: LoadedSpec, registry: Registry) -> None:
    """Hold submission ``key`` (``state/inflight.py``) in ``lease``. While another live submit
    holds it, refuse (``UsageError``): two submits of one file at once are the same submission
    twice (a double Enter, a retrying wrapper), and its promise is one job — the live submit
    starts it; starting a second here would make a rerun ambiguous and send everything twice."""
    try:
        lease.enter_context(inflight.held(key))
    except inflight.Busy as busy:
        reserved = registry.unconfirmed(key)
        raise UsageError(
            f"another orch submit of {loaded.path} to the same host(s) is running ({busy.holder.describe()})"
            f"{f', reserving {reserved.job_id}' if reserved else ''}: it starts this job once, so this one "
            "starts nothing. Wait for it (orch status), or change the job file (e.g. name:) to run a second job"
        ) from None


def plan_syncs(remotes: list[Remote], hellos: list[dict[str, Any]], loaded: LoadedSpec,
               files: dict[str, selection.LocalFile], project: str, force: bool, pull_remote_edits: bool,
               say: Say) -> list[selection.SyncPlan]:
    """What to send each host (``sync.plan_sync``), saying so; with ``pull_remote_edits`` the
    files edited on a host come back to the workspace first. Sends nothing."""
    workspace, exclude = loaded.workspace_dir, loaded.spec.workspace.exclude
    pulled: set[str] = set()
    if pull_remote_edits:
        for remote, hello in zip(remotes, hellos):
            edited = [p for p in hello.get("sync", {}).get("edited", []) if p in files and p not in pulled]
            if edited:
                say(f"{remote.host.name}: bringing back {len(edited)} file(s) edited there: {', '.join(edited[:10])}")
                pulled.update(transfer.pull(remote, project, workspace, edited))
        if pulled:
            files = selection.select_files(workspace, exclude)
    for remote, hello in zip(remotes, hellos):
        say_lock_holder(remote.host.name, hello.get("sync", {}).get("lock"), say)
    sync_plans = [selection.plan_sync(workspace, files, h.get("sync", {}), force, frozenset(pulled)) for h in hellos]
    for remote, sp in zip(remotes, sync_plans):
        say(f"{remote.host.name}: syncing {sp.summary()}")
    return sync_plans


def say_lock_holder(host: str, holder: Any, say: Say) -> None:
    """Name an earlier sync that still holds the workspace's lock (from ``hello``; untrusted)."""
    if not isinstance(holder, dict):
        return
    try:
        pid, idle, started = int(holder.get("pid", 0)), float(holder.get("idle_s", 0)), float(holder.get("started", 0))
    except (TypeError, ValueError):
        return
    since = datetime.fromtimestamp(started).strftime("%H:%M:%S") if started > 0 else "?"
    say(f"{host}: an earlier sync of this workspace (pid {pid}, since {since}) still holds its lock, no progress "
        f"for {idle:.0f} s; waiting — it is stopped after {settings.LEASE_STALL.seconds():.0f} s without progress")


def start_nodes(remotes: list[Remote], plan: Plan, extra: dict[str, Any], say: Say,
                staged: list[str] | None = None, last: bool = True) -> None:
    """Send each node its launch request (job.json + ``extra``, and the values of the job's
    ``secret_env``, read from the laptop's environment: ``secrets``) and start its supervisor;
    ``staged``: each node's code as its sync set it apart (``sync.send``), ``last``: no later
    launch takes it (a sweep launches several jobs from one)."""
    values = secrets.read(plan.secret_env, "orch submit")

    def launch(rank: int) -> dict[str, Any]:
        request = {"job": plan.job_json(), "train": plan.train, "node_rank": rank, "secrets": values, **extra}
        if staged is not None:
            request.update(staged=staged[rank], last=last)
        return remotes[rank].call("launch", request=request)

    replies = parallel(launch, range(len(remotes)))
    if any(r.get("existing") for r in replies):
        say(f"{plan.job_id} was already started by an interrupted submit of this file: not started twice")
    elif replies[0].get("slurm_job"):
        say(f"submitted {plan.job_id} to Slurm on {remotes[0].host.name}: Slurm job {replies[0]['slurm_job']}, "
            f"{len(plan.nodes)} node(s)")
    else:
        say(f"started {plan.job_id} on {', '.join(r.host.name for r in remotes)}")


@dataclass(frozen=True)
class Unit:
    """One job of a batch: ``index`` (its number: a sweep's combination), its spec, hosts (node
    order), job id and submission ``key``; ``sweep`` its place in a sweep; ``rerun_of`` the
    job whose recorded code snapshot it runs (no sync: ``orch rerun``); ``tell`` how its lines
    are said (a sweep heads them with the combination)."""

    index: int
    loaded: LoadedSpec
    hosts: tuple[Host, ...]
    job_id: str
    key: str
    sweep: SweepEntry | None = None
    rerun_of: str | None = None
    tell: Say | None = None

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]


@dataclass(frozen=True)
class Missed:
    """A job this submit did not start: why (one line), the exit code of that cause (3
    unreachable, 4 a step on the host failed, 2 refused, 130 interrupted), how it ended
    (``outcome.Ending``), and the job id of a reservation left because its host could not be
    asked whether it started."""

    unit: Unit
    reason: str
    code: int
    ending: outcome.Ending
    job_id: str | None = None


@dataclass
class BatchResult:
    """What ``run_batch`` did: the plan of each job planned (by index), the jobs launched
    (index order), those missed, the warnings said, the first sync's summary."""

    plans: dict[int, Plan] = field(default_factory=dict)
    launched: list[int] = field(default_factory=list)
    missed: dict[int, Missed] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    sync_summary: dict[str, Any] | None = None


@dataclass
class Batch:
    """The jobs of one submit over ``hosts`` (a ``HostSet``, opened by the caller with each
    host's stage token, ``stages``), the workspace's ``files`` as selected, ``project`` its
    name. ``lone``: one job whose first failure ends the submit (see the module docstring)."""

    units: list[Unit]
    hosts: HostSet
    project: str
    files: dict[str, selection.LocalFile]
    stages: dict[str, str]
    say: Say
    lone: bool = False
    force: bool = False
    pull_remote_edits: bool = False
    dry_run: bool = False
    reused: frozenset[str] = frozenset()  # job ids an earlier, interrupted submit reserved
    result: BatchResult = field(default_factory=BatchResult)
    reserved: dict[int, dict[str, Any]] = field(default_factory=dict)

    def miss(self, unit: Unit, exc: BaseException, launching: bool = False) -> None:
        """``unit`` is not started, because of ``exc``. A lone job's failure is raised: recorded
        with its reservation first when it has one (``outcome.recorded``: a rerun of the same
        submit keeps the id); an ``orch rerun``'s as it is."""
        if self.lone:
            if unit.index in self.reserved and unit.rerun_of is None:
                raise outcome.recorded(self.hosts.registry, unit.job_id, self.reserved[unit.index], exc,
                                       launching) from None
            raise exc
        if not isinstance(exc, OrchError):
            raise exc
        self.result.missed[unit.index] = Missed(unit, naming(unit.names[0], exc), exc.exit_code,
                                                outcome.classify(exc, launching))

    def lost_host(self, unit: Unit) -> bool:
        """A host of ``unit`` is out: the unit is missed for that host's failure."""
        name = next((n for n in unit.names if n in self.hosts.down), None)
        if name is None:
            return False
        reason, code, exc = self.hosts.down[name]
        if self.lone:
            self.miss(unit, exc)
        self.result.missed[unit.index] = Missed(unit, reason, code, outcome.classify(exc))
        return True

    def reserve(self, unit: Unit, plan: Plan) -> None:
        """Record ``unit``'s job id as ``SUBMITTING`` under its submission key (kept until the
        launch is confirmed, or settled)."""
        detail = {"submission": unit.key, **slurmcheck.log_nodes(plan)} if unit.key else {}
        registry = self.hosts.registry
        registry.add(unit.job_id, unit.loaded.spec.name, str(unit.loaded.path), unit.names, plan.job_dir, SUBMITTING,
                     detail or None, sweep=unit.sweep, secret_env=plan.secret_env, ports=unit.loaded.spec.launch.ports)
        if unit.job_id in self.reused:  # an earlier submit's reservation: this submit's ending replaces its
            registry.update(unit.job_id, SUBMITTING, detail)
        self.reserved[unit.index] = detail


def run_batch(batch: Batch) -> BatchResult:
    """Plan, check, sync and launch every job of ``batch`` (the module docstring's sequence and
    contracts). Raises a lone job's failure; Ctrl-C is raised as it is (the caller says what
    it left out), ``batch.result`` holding what was launched by then."""
    result, hosts = batch.result, batch.hosts
    planned: list[Unit] = []
    for unit in batch.units:
        if batch.lost_host(unit):
            continue
        remotes = [hosts.remotes[n] for n in unit.names]
        try:
            plan, warnings = checked_plan(unit.loaded, batch.project, remotes, [hosts.hellos[n] for n in unit.names],
                                          unit.job_id)
        except OrchError as exc:
            batch.miss(unit, exc)
            continue
        result.plans[unit.index] = plan
        result.warnings += [w if batch.lone else f"combination {unit.index}: {w}" for w in warnings]
        planned.append(unit)
    for warning in dict.fromkeys(result.warnings):
        batch.say(f"warning: {warning}")
    if batch.dry_run:
        return result
    for unit in planned:
        if len(unit.hosts) > 1:
            try:
                check_rendezvous([hosts.remotes[n] for n in unit.names], result.plans[unit.index], batch.say)
            except OrchError as exc:
                batch.miss(unit, exc)
    planned = [u for u in planned if u.index not in result.missed]
    plans = _plan_syncs(batch, list(dict.fromkeys(n for u in planned if u.rerun_of is None for n in u.names)))
    if batch.lone:
        for unit in planned:
            batch.reserve(unit, result.plans[unit.index])
    try:
        pause("before-sync")
        _sync(batch, plans)
        pause("after-sync")
    except BaseException as exc:
        if batch.lone and planned:
            batch.miss(planned[0], exc)
        raise
    git = repro.git_state(planned[0].loaded.workspace_dir) if planned and not batch.lone else None
    for at, unit in enumerate(planned):
        if batch.lost_host(unit):
            continue
        last = all(not set(unit.names) & set(later.names) for later in planned[at + 1:])
        _launch(batch, unit, git, last)
    _collect(batch, list(dict.fromkeys(n for u in planned for n in u.names)))
    return result


def _collect(batch: Batch, names: list[str]) -> None:
    """Each host of ``names`` with ``gc_keep_days`` collects once the launches are done
    (``reclaim.auto``: one line, never a failure of the submit)."""
    for name in names:
        remote = batch.hosts.remotes.get(name)
        if remote is not None and name not in batch.hosts.down and remote.host.gc_keep_days is not None:
            reclaim.auto(remote, remote.host, batch.hosts.registry, [batch.project], batch.say)


def _plan_syncs(batch: Batch, names: list[str]) -> dict[str, selection.SyncPlan]:
    """Each host of ``names``'s sync plan (``plan_syncs``), its tree set apart under the host's
    stage token — unless ``hello`` set it apart already (nothing to send). A lone job's hosts
    are planned together (files pulled back from one are not sent to another as changed); in
    a batch of several a host whose planning fails is out."""
    hosts, plans = batch.hosts, {}
    if not names:
        return plans
    loaded = batch.units[0].loaded
    groups = [names] if batch.lone else [[n] for n in names if n in hosts.remotes]
    for group in groups:
        try:
            made = plan_syncs([hosts.remotes[n] for n in group], [hosts.hellos[n] for n in group], loaded, batch.files,
                              batch.project, batch.force, batch.pull_remote_edits, batch.say)
        except OrchError as exc:
            if batch.lone:
                raise
            hosts.fail(group[0], exc)
            continue
        plans.update(zip(group, made))
    trace.mark("plan", "; ".join(f"{n}: {p.summary()}" for n, p in plans.items()))
    for name, sync_plan in plans.items():
        if sync_plan.noop and staged_in_hello(hosts.hellos[name]):
            trace.mark("stage", f"{name}: set apart from the server's record in hello")
        else:
            sync_plan.stage = batch.stages[name]
    return plans


def _sync(batch: Batch, plans: dict[str, selection.SyncPlan]) -> None:
    """Send each host its plan, all at once (Ctrl-C: every stream stops, and the ``Interrupted``
    error says what each host kept); in a batch of several a host whose sync fails is out and
    said."""
    hosts, names = batch.hosts, list(plans)
    if not names:
        return

    def failed(i: int, exc: OrchError) -> None:
        hosts.fail(names[i], exc)
        batch.say(f"{names[i]}: sync failed ({first_line(exc)}): its combinations are not started")

    summaries = transfer.send_all([hosts.remotes[n] for n in names], batch.project,
                                  batch.units[0].loaded.workspace_dir, [plans[n] for n in names],
                                  None if batch.lone else failed)
    batch.result.sync_summary = summaries[0]


def _launch(batch: Batch, unit: Unit, git: tuple[dict[str, Any] | None, str | None] | None, last: bool) -> None:
    """Launch ``unit`` on its hosts' staged trees. In a batch of several: its host asked first
    (a silent one gets no reservation), then the id reserved and the launch sent; a launch that
    fails is settled by asking the host again (``settle``)."""
    hosts, registry = batch.hosts, batch.hosts.registry
    plan = batch.result.plans[unit.index]
    if not batch.lone:
        try:
            hosts.job_state(unit.names[0], unit.job_id)
        except OrchError:
            batch.lost_host(unit)
            return
        batch.reserve(unit, plan)
    extra: dict[str, Any] = {"project": batch.project}
    extra.update({"from_job": unit.rerun_of} if unit.rerun_of else {"repro": repro.record(unit.loaded, git)})
    staged = None if unit.rerun_of else [batch.stages[n] for n in unit.names]
    try:
        start_nodes([hosts.remotes[n] for n in unit.names], plan, extra, unit.tell or batch.say, staged, last)
    except BaseException as exc:
        if batch.lone or not isinstance(exc, OrchError):
            batch.miss(unit, exc, launching=True)
        assert isinstance(exc, OrchError)
        _settle_launch(batch, unit, exc)
        return
    registry.update(unit.job_id, "pending", slurmcheck.log_nodes(plan))
    batch.result.launched.append(unit.index)
    trace.mark("launched", unit.job_id)


def _settle_launch(batch: Batch, unit: Unit, exc: OrchError) -> None:
    """A launch of a batch of several that failed with ``exc``: ask the host whether the job
    started (``settle``); started → launched, not there → missed, the host silent → missed
    with its reservation kept and its ending recorded (``outcome.recorded``)."""
    hosts, name = batch.hosts, unit.names[0]
    if isinstance(exc, HostError):  # the link is gone: the host cannot be asked
        hosts.fail(name, exc)
    how = settle(hosts, name, unit.job_id)
    if how == "started":
        batch.result.launched.append(unit.index)
        return
    reason, ending = naming(name, exc), outcome.classify(exc, launching=True)
    if how == "unknown":
        outcome.recorded(hosts.registry, unit.job_id, batch.reserved[unit.index], exc, True)
        batch.result.missed[unit.index] = Missed(
            unit, f"{reason} during its launch (job {unit.job_id}; it may have started there)", exc.exit_code,
            ending, unit.job_id)
    else:
        batch.result.missed[unit.index] = Missed(unit, reason, exc.exit_code, ending)


def settle(hosts: HostSet, name: str, job_id: str) -> str:
    """Settle reservation ``job_id`` by asking host ``name`` whether the job exists:
    ``"started"`` (its status recorded), ``"void"`` (the reservation removed), or ``"unknown"``
    (the host cannot be asked: kept)."""
    registry = hosts.registry
    if name not in hosts.remotes:
        return "unknown"
    try:
        status = hosts.job_state(name, job_id)
    except OrchError:
        return "unknown"
    if status is None:
        registry.forget_reservation(job_id)
        return "void"
    registry.update(job_id, str(status["state"]), {k: v for k, v in status.items() if k != "job_id"})
    return "started"

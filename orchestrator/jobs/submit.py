"""Submit: connect → hello → plan → (multi-node preflight) → sync → launch, on every node
at once.

``submit`` never starts a job twice: the job id is reserved in the registry under a
submission key before anything is sent, a rerun of an interrupted submit reuses it, and the
agent refuses an id that already exists on the host. A live submit holds its key
(``state/inflight.py``), so a second submit of the same file at the same time is refused
rather than taking its reservation. Each node's code is set apart as it is sent
(``sync.send`` with ``SyncPlan.stage``) and launched from there: what a job runs is what its
own submit sent. A resubmit that changed nothing (its selection is the record the laptop holds
of the host's) has it set apart from the server's record in ``hello`` instead: no receive. How a submit that stopped ended is decided in ``outcome.py``.
"""

from __future__ import annotations

import hashlib
import os
import threading
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from orchestrator import trace
from orchestrator.access.connect import ask_on_tty, open_transport
from orchestrator.checks import slurm as slurmcheck
from orchestrator.errors import RemoteError, UsageError
from orchestrator.helper.remote import Remote, helper_argv
from orchestrator.hosts.inventory import Host, Inventory
from orchestrator.jobs import launchconfig, outcome
from orchestrator.jobs import record as repro
from orchestrator.jobs import secrets
from orchestrator.jobs.nodes import parallel
from orchestrator.plan import slurm as slurmplan
from orchestrator.plan.build import HostFacts, Plan, build_plan, make_job_id
from orchestrator.spec.load import LoadedSpec, parse_spec
from orchestrator.state import inflight, runs
from orchestrator.state.registry import SUBMITTING, JobRecord, Registry
from orchestrator.sync import excluded
from orchestrator.sync import record as synccache
from orchestrator.sync import selection
from orchestrator.sync import send as transfer
from orchestrator.testhooks import pause

Say = Callable[[str], None]
LISTEN_S = 30.0


@dataclass(frozen=True)
class Submitted:
    plan: Plan
    sync_summary: dict[str, Any] | None
    warnings: list[str]
    remotes: dict[str, Remote] = field(default_factory=dict)  # by host name, open while ``keep`` is
    selection: dict[str, Any] | None = None  # files, bytes, and what the ignore rules left out (excluded.Summary)


def submission_key(loaded: LoadedSpec, hosts: list[Host]) -> str:
    """Identifies "the same submission": this spec file, this text, these hosts. A submit
    cut off before the laptop saw the launch confirmed reuses its job id, so a rerun can
    never start the job twice."""
    material = "\0".join([str(loaded.path), loaded.text, *(h.name for h in hosts)])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def connect_all(hosts: list[Host], inventory: Inventory, trust: Callable[[str], bool], stack: ExitStack) -> list[Remote]:
    """Connect to every host at once; each open connection is closed by ``stack``."""
    lock = threading.Lock()

    def one(host: Host) -> Remote:
        transport = open_transport(host, inventory, trust, warm=helper_argv(host))
        with lock:
            stack.enter_context(transport)
        return Remote(host, transport)

    return parallel(one, hosts)


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
    plan and the warnings to say."""
    for remote, hello in zip(remotes, hellos):
        if remote.host.slurm:
            slurmcheck.cluster(remote.host, hello)
    plan = plan_for(loaded, project, remotes, hellos, job_id)
    return plan, slurmcheck.job_problems(loaded.spec, [r.host for r in remotes], hellos, plan)


def plan_for(loaded: LoadedSpec, project: str, remotes: list[Remote], hellos: list[dict[str, Any]],
             job_id: str) -> Plan:
    """The plan from each node's ``hello``; a multi-node job without ``rdzv_port`` gets a
    free port on the first node."""
    facts = [HostFacts.model_validate({k: h.get(k) for k in HostFacts.model_fields if k in h}) for h in hellos]
    port = None
    if len(remotes) > 1 and loaded.spec.launch.rdzv_port is None:
        port = remotes[0].call("free_port")["port"]
    hosts = [r.host for r in remotes]
    spec = launchconfig.counted(loaded.spec, Path(loaded.workspace_dir))
    return build_plan(spec, loaded.text, str(loaded.workspace_dir), project, hosts, facts, job_id, port)


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
        remotes = connect_all(hosts, inventory, trust, stack)
        earlier = registry.unconfirmed(key)  # left by a submit that is over: this one holds the key
        job_id = earlier.job_id if earlier else make_job_id(spec.name, datetime.now(), os.urandom(8))
        staged = [f"{job_id}-{rank}" for rank in range(len(hosts))]  # each node's code, set apart as it is sent
        unchanged = None if dry_run else (lambda recorded: selection.same_as_record(files, recorded))
        hellos = parallel(lambda i: synccache.hello(remotes[i], project, gpus=True, stage=staged[i],
                                                    unchanged=unchanged), range(len(remotes)))
        plan, cluster_warnings = checked_plan(loaded, project, remotes, hellos, job_id)
        warnings += cluster_warnings
        for warning in warnings:
            say(f"warning: {warning}")
        if dry_run:
            return Submitted(plan, None, warnings, selection=chosen)
        if len(hosts) > 1:
            check_rendezvous(remotes, plan, say)
        sync_plans = plan_syncs(remotes, hellos, loaded, files, project, force, pull_remote_edits, say)
        trace.mark("plan", "; ".join(f"{r.host.name}: {p.summary()}" for r, p in zip(remotes, sync_plans)))
        for remote, hello, sync_plan, token in zip(remotes, hellos, sync_plans, staged):
            if not (sync_plan.noop and staged_in_hello(hello)):  # else set apart by hello already: nothing to send
                sync_plan.stage = token
            else:
                trace.mark("stage", f"{remote.host.name}: set apart from the server's record in hello")
        reserved = {"submission": key, **slurmcheck.log_nodes(plan)}
        registry.add(job_id, spec.name, str(loaded.path), [h.name for h in hosts], plan.job_dir, SUBMITTING, reserved,
                     secret_env=plan.secret_env)
        if earlier is not None:  # this submit's ending replaces the earlier one's
            registry.update(job_id, SUBMITTING, reserved)
        launching = False
        try:
            pause("before-sync")
            summaries = transfer.send_all(remotes, project, workspace, sync_plans)  # Ctrl-C: says what was kept
            pause("after-sync")
            launching = True
            start_nodes(remotes, plan, {"project": project, "repro": repro.record(loaded)}, say, staged)
            trace.mark("launched", plan.job_id)
        except BaseException as exc:
            raise outcome.recorded(registry, job_id, reserved, exc, launching) from None
        registry.update(job_id, "pending", slurmcheck.log_nodes(plan))
        lease.close()  # launched: the same file submitted again from now on is a new job
        if keep is not None:
            keep.push(stack.pop_all())
        return Submitted(plan, summaries[0], warnings, {r.host.name: r for r in remotes} if keep is not None else {},
                         chosen)


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
        f"for {idle:.0f} s; waiting — it is stopped after {transfer.STALL_S:.0f} s without progress")


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


def rerun(record: JobRecord, inventory: Inventory, registry: Registry, *, say: Say,
          trust: Callable[[str], bool] = ask_on_tty) -> Plan:
    """Submit an earlier job again as a new job: the spec text it recorded and its own code
    snapshot (hard-linked on each host), not today's workspace."""
    with ExitStack() as stack:
        first = connect_all([inventory.get(record.hosts[0])], inventory, trust, stack)[0]
        shown = first.call("show", job=record.job_id)
        if not isinstance(shown.get("spec_text"), str):
            raise UsageError(f"{record.job_id} has no recorded spec on {first.host.name}: it cannot be rerun")
        loaded = parse_spec(shown["spec_text"], Path(record.spec_path))
        secrets.recorded(loaded.spec.secret_env, record, f"orch rerun {record.job_id}")
        hosts = [inventory.resolve(ref) for ref in loaded.spec.hosts]
        remotes = [first] + connect_all(hosts[1:], inventory, trust, stack)
        project = selection.project_name(loaded.workspace_dir)
        hellos = parallel(lambda r: r.call("hello", gpus=True, slurm=r.host.hello_slurm), remotes)
        job_id = make_job_id(loaded.spec.name, datetime.now(), os.urandom(8))
        plan, warnings = checked_plan(loaded, project, remotes, hellos, job_id)
        for warning in warnings:
            say(f"warning: {warning}")
        registry.add(job_id, loaded.spec.name, record.spec_path, [h.name for h in hosts], plan.job_dir, SUBMITTING,
                     secret_env=plan.secret_env)
        start_nodes(remotes, plan, {"project": project, "from_job": record.job_id}, say)
        registry.update(job_id, "pending", slurmcheck.log_nodes(plan))
        return plan

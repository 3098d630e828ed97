"""A submitted job across its nodes: status (aggregated), cancel and resume.

A job's state is the aggregate of its nodes' states: ``failed`` if any node failed,
``lost`` if any node is lost (and none failed), ``cancelled`` if any was cancelled,
``succeeded`` only when every node succeeded, otherwise the most active of running,
setting_up, queued (waiting for GPUs in its host's queue: the job's place is its last queued
node's), pending. When a node failed or is lost while others still run, those others
are stopped (they would only hang in a collective until a timeout).

A job whose provider box is off, released or failed (``access/provisioned.py``:
``InstanceDown``) stopped with it: ``stopped_with_box`` ends a follow or watch with the
provider's words and the way on (``StoppedWithBox``, exit 1), and when the box stopped (the
provider's time where it gives one, else when orch first saw it down) is recorded in the job's
status (``BOX_STOPPED_AT``), where ELAPSED and COST end
(``display/progress.py``: ``row_fields``) until an attempt starts after it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Callable, Sequence, TypeVar

from orchestrator.access.connect import open_transport
from orchestrator.access.provisioned import InstanceDown
from orchestrator.errors import HostError, OrchError, RemoteError, UsageError
from orchestrator.helper.remote import Remote
from orchestrator.hosts.inventory import Host, Inventory
from orchestrator.jobs import secrets
from orchestrator.jobs.outcome import reservation_reason
from orchestrator.providers.api import ProviderError
from orchestrator.providers.open import provider_of
from orchestrator.state import fences, kits, reach
from orchestrator.state.registry import SUBMITTING, JobRecord, Registry
from orchestrator.sync.excluded import explained_status
from orchestrator.termtext import clean
from orchestrator.transport.base import never
from remote_payload.contract.protocol import ACTIVE, GRACE_S, RESUMABLE, TERMINAL

T = TypeVar("T")
R = TypeVar("R")
STOP_GRACE_S = 10.0
BOX_STOPPED_AT = "box_stopped_at"  # in a job's status: when its box stopped (the provider's time, else first seen)


class StoppedWithBox(OrchError):
    """A follow or watch stopped because the job's provider box is off, released or failed:
    the job did not succeed (exit 1). ``str()`` is ``stopped_words``."""

    exit_code = 1


def stopped_words(down: InstanceDown, job_id: str, registry: Registry) -> str:
    """The provider's word on the job's box and the way on, one line: ``orch up`` then ``orch
    resume`` for a box that is off or failed; for one released, ``orch resume --on`` from the
    copy ``orch fetch --watch`` kept (docs/moving.md), or that there is none."""
    said = down.status or down.state
    said += "" if said == down.state else f" ({'powered off' if down.state == 'off' else down.state})"
    head = f"{down.host}: {down.provider} says the instance {down.instance} is {said}"
    if down.state == "preempted":
        kit = kits.recorded(registry.path, job_id)
        return (f"{head}: {job_id} stopped with it; orch resume {job_id} once the instance runs again"
                + (f", or orch resume {job_id} --on OTHER_HOST from the copy orch fetch --watch kept in {kit}"
                   if kit is not None else ""))
    if down.state != "released":
        return f"{head}: {job_id} stopped with it; orch up {down.host}, then orch resume {job_id}"
    kit = kits.recorded(registry.path, job_id)
    if kit is not None:
        return (f"{head}: {job_id}'s files on it are gone; orch resume {job_id} --on OTHER_HOST continues it "
                f"from the copy orch fetch --watch kept in {kit}")
    return (f"{head}: {job_id}'s files on it are gone and no copy was kept here (orch fetch --watch keeps one); "
            f"submit its job file again on another host")


def provider_stop_time(down: InstanceDown, inventory: Inventory) -> float | None:
    """When the provider says the box stopped (``Provider.stopped_at``, one call); None where
    it does not say, cannot be asked now, or names a time still to come."""
    try:
        stopped = provider_of(inventory.get(down.host)).stopped_at(down.instance)
    except OrchError:
        return None
    return stopped.timestamp() if stopped is not None and stopped.timestamp() <= time.time() else None


def box_stopped_at(record: JobRecord, registry: Registry, stop_time: Callable[[], float | None]) -> float:
    """When ``record``'s box stopped: the time recorded in its status, else the provider's
    (``stop_time()``, asked only then) or now, recorded there (and kept by ``refresh`` until an
    attempt starts after it), so it never moves."""
    seen = record.detail.get(BOX_STOPPED_AT)
    if isinstance(seen, (int, float)) and not isinstance(seen, bool):
        return float(seen)
    when = stop_time() or time.time()
    registry.update(record.job_id, record.state, dict(record.detail, **{BOX_STOPPED_AT: when}))
    return when


def stopped_with_box(down: InstanceDown, record: JobRecord, registry: Registry,
                     inventory: Inventory) -> dict[str, Any]:
    """What a follow or watch does when its job's box is down: the job's recorded status when
    it ended before its box stopped (``on_finish.power_off`` after a success another command
    saw); else ``StoppedWithBox`` raised with ``stopped_words``, the stop recorded
    (``box_stopped_at``)."""
    now = registry.get(record.job_id)
    if now.state in TERMINAL:
        return now.status()
    box_stopped_at(now, registry, partial(provider_stop_time, down, inventory))
    raise StoppedWithBox(stopped_words(down, now.job_id, registry))


def _carried(record: JobRecord, status: dict[str, Any]) -> dict[str, Any]:
    """``status`` with the recorded ``BOX_STOPPED_AT`` kept while no attempt started after it
    (a box powered on again shows the job lost; its cost still ends at the stop)."""
    seen, started = record.detail.get(BOX_STOPPED_AT), status.get("started")
    if not isinstance(seen, (int, float)) or isinstance(seen, bool):
        return status
    if isinstance(started, (int, float)) and not isinstance(started, bool) and started > seen:
        return status
    return dict(status, **{BOX_STOPPED_AT: seen})


def parallel(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``fn`` over ``items`` in threads; results in order; the first error is raised."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        futures = [pool.submit(fn, item) for item in items]
        return [f.result() for f in futures]


def nodes_of(record: JobRecord, inventory: Inventory) -> list[Host]:
    return [inventory.get(name) for name in record.hosts]


def call_node(host: Host, inventory: Inventory, op: str, *, timeout: float = 300, **args: Any) -> dict[str, Any]:
    """Request ``op`` (``remote_payload/contract/protocol.py``) of one host on a connection of its own."""
    with open_transport(host, inventory, never) as transport:
        return Remote(host, transport).call(op, timeout=timeout, **args)


def statuses(host: Host, inventory: Inventory, job_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each of ``job_ids``' status on ``host`` (checked by the protocol); ``RemoteError``
    when the reply leaves one out."""
    jobs = call_node(host, inventory, "status", jobs=job_ids)["jobs"]
    missing = [j for j in job_ids if j not in jobs]
    if missing:
        raise RemoteError(f"{host.name}: the status reply leaves out {', '.join(missing[:3])}")
    return {j: jobs[j] for j in job_ids}


def aggregate(per_node: list[dict[str, Any]]) -> dict[str, Any]:
    """One status for the job from its nodes' statuses (node order = host order); while it
    is active, the ``not_answering_s`` and ``supervisor_process`` of the node whose supervisor
    has been silent longest."""
    states = [s.get("state") for s in per_node]
    if all(s == "succeeded" for s in states):
        state = "succeeded"
    else:
        state = next((s for s in ("failed", "lost", "cancelled", *ACTIVE, "unknown") if s in states), "unknown")
    first = per_node[0]
    out = dict(first, state=state)
    if any(s.get("unsupervised") for s in per_node):
        out["unsupervised"] = True
    silent = [s for s in per_node if isinstance(s.get("not_answering_s"), (int, float)) and s.get("state") in ACTIVE]
    out.pop("not_answering_s", None)
    if silent and state in ACTIVE:  # a node's supervisor does not answer (remote_payload/jobdir/answering.py)
        worst = max(silent, key=lambda s: s["not_answering_s"])
        out.update({k: worst[k] for k in ("not_answering_s", "supervisor_process") if k in worst})
    places = [s["queue_position"] for s in per_node
              if s.get("state") == "queued" and isinstance(s.get("queue_position"), int)]
    out.pop("queue_position", None)
    if state == "queued" and places:
        out["queue_position"] = max(places)
    culprit = next((s for s in per_node if s.get("state") == state and s.get("reason")), None)
    if len(per_node) > 1:
        out["nodes"] = per_node
        if culprit is not None:
            out["reason"] = f"node {culprit.get('node_rank', per_node.index(culprit))}: {culprit['reason']}"
        metrics = next((s["metrics"] for s in per_node if isinstance(s.get("metrics"), dict)), None)
        if metrics is not None:
            out["metrics"] = metrics
        codes = [s.get("exit_code") for s in per_node]
        out["exit_code"] = next((c for c in codes if c not in (0, None)), codes[0])
    return out


def job_status(record: JobRecord, per_node: list[dict[str, Any]]) -> dict[str, Any]:
    """``aggregate`` of the nodes' statuses, with a failure on a file the laptop's ignore rules
    left out explained in ``reason`` (``sync/excluded.py``, ``explained_status``): the one
    place a job's status is made before it is recorded and shown (status, logs -f, --follow)."""
    return explained_status(aggregate(per_node), record.job_dir, record.spec_path)


def _stop_stragglers(record: JobRecord, hosts: list[Host], inventory: Inventory,
                     per_node: list[dict[str, Any]]) -> list[dict[str, Any]]:
    broken = [s for s in per_node if s.get("state") in ("failed", "lost")]
    running = [i for i, s in enumerate(per_node) if s.get("state") not in TERMINAL + ("lost", "unknown", "unreachable")]
    if not broken or not running:
        return per_node

    def stop(i: int) -> dict[str, Any]:
        status = call_node(hosts[i], inventory, "cancel", job=record.job_id, grace=STOP_GRACE_S,
                           timeout=STOP_GRACE_S + 60)
        return dict(status, reason=f"stopped because another node {broken[0]['state']}")

    stopped = dict(zip(running, parallel(stop, running)))
    return [stopped.get(i, s) for i, s in enumerate(per_node)]


def refresh(records: list[JobRecord], inventory: Inventory, registry: Registry,
            warn: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Statuses for ``records``: one connection per host for all its unfinished jobs;
    finished jobs (``TERMINAL``) keep the registry's word and cost no connection, and
    unreachable hosts' jobs keep it too (marked ``stale``). A job seen terminal here is
    recorded with its whole status (state, reason, metrics) for later calls.

    A provider host whose provider refuses or does not answer (a rotated token, the API down:
    ``ProviderError``) is warned about once; its jobs keep the registry's word, marked ``stale``,
    with the provider's words as ``reason`` and ``provider_error``; the other hosts' jobs are
    unaffected and nothing is raised. Such a failure says nothing of the box itself, so it is
    not recorded in ``reach``.

    A provider host whose provider says its instance is off, released or failed
    (``InstanceDown``) is unreachable as above, and its unfinished jobs carry
    ``BOX_STOPPED_AT`` (``box_stopped_at``: recorded the first time, the provider's stop time
    where it gives one) and the provider's words
    with the way on as ``reason`` (``stopped_words``); the time stays in the job's status while
    no attempt started after it, so its cost never grows past the stop.

    Every contact is recorded (``reach``): an unfinished job on a host that has failed for
    ``ORCH_LOST_AFTER_S`` shows ``lost`` with ``reach.lost_reason`` (plus ``unreachable_since``
    and ``last_contact``) — shown only, never recorded, so it shows its real state again when
    the host answers.

    The hosts where these jobs have superseded attempts not yet stopped (``fences``: the job
    moved away while they did not answer) are contacted too, which stops those attempts
    (``helper/fence.py``); one still waiting is warned about (``unfenced``) and listed in the
    job's ``superseded_running_on``."""
    out = {r.job_id: r.status() for r in records}
    pending = [r for r in records if r.state not in TERMINAL]
    by_host: dict[str, list[str]] = defaultdict(list)
    for r in pending:
        for name in r.hosts:
            by_host[name].append(r.job_id)
    fenced = fences.pending(registry.path, job_ids=[r.job_id for r in records])
    for f in fenced:  # a moved job's old host is contacted too: the contact stops the superseded attempt
        by_host.setdefault(f.host, [])
    answers: dict[tuple[str, str], dict[str, Any]] = {}
    lost: dict[str, reach.Reach] = {}
    refused: dict[str, str] = {}  # host -> its provider's words, when the provider failed
    down: dict[str, InstanceDown] = {}  # host -> its provider's word that the box is off, released or failed

    def ask(name: str) -> None:
        try:
            jobs = statuses(inventory.get(name), inventory, by_host[name])
        except HostError as exc:
            if isinstance(exc, InstanceDown):
                down[name] = exc
            warn(f"warning: {str(exc).splitlines()[0]}")
            seen = reach.record(registry.path, name, ok=False, error=str(exc).splitlines()[0])
            if reach.is_lost(seen) and by_host[name]:
                lost[name] = seen
                warn(f"warning: {reach.unreachable(seen)}: its unfinished jobs show lost; if the instance is "
                     "gone: orch resume JOB --on OTHER_HOST")
            return
        except ProviderError as exc:  # its provider refused or did not answer: only its rows say so
            refused[name] = str(exc).splitlines()[0]
            warn(f"warning: {name}: {refused[name]}")
            return
        except (UsageError, RemoteError) as exc:
            warn(f"warning: {str(exc).splitlines()[0]}")
            return
        reach.record(registry.path, name, ok=True)
        for job_id, status in jobs.items():
            answers[(name, job_id)] = status

    parallel(ask, list(by_host))
    for r in pending:
        per_node = [answers.get((name, r.job_id)) for name in r.hosts]
        stopped = next((down[name] for name in r.hosts if name in down), None)
        if stopped is not None:  # its cost ends where the box stopped
            when = box_stopped_at(r, registry, partial(provider_stop_time, stopped, inventory))
            out[r.job_id].update({BOX_STOPPED_AT: when,
                                  "reason": stopped_words(stopped, r.job_id, registry)})
        gone = next((lost[name] for name in r.hosts if name in lost), None)
        if gone is not None:
            out[r.job_id] = dict(out[r.job_id], state="lost",
                                 reason=out[r.job_id]["reason"] if stopped else reach.lost_reason(gone, r.job_id),
                                 unreachable_since=gone.failing_since, last_contact=gone.last_ok)
            continue
        if any(s is None for s in per_node):
            out[r.job_id]["stale"] = True
            words = next((f"{name}: {refused[name]}" for name in r.hosts if name in refused), None)
            if words is not None:
                out[r.job_id].update(reason=words, provider_error=words)
            continue
        if r.state == SUBMITTING and all(s["state"] == "unknown" for s in per_node):
            out[r.job_id]["reason"] = reservation_reason(r.detail)
            continue
        per_node = _stop_stragglers(r, nodes_of(r, inventory), inventory, per_node)  # type: ignore[arg-type]
        status = _carried(r, job_status(r, per_node))  # type: ignore[arg-type]
        registry.update(r.job_id, status["state"], status)
        out[r.job_id] = dict(status, job_id=r.job_id)
    for f in fences.pending(registry.path, job_ids=[f.job_id for f in fenced]):
        warn(unfenced(f))
        out[f.job_id] = dict(out[f.job_id])
        out[f.job_id].setdefault("superseded_running_on", []).append(f.host)
    return out


def unfenced(f: fences.Fence) -> str:
    """The warning for a superseded attempt orch has not yet stopped (its host has not answered)."""
    return (f"warning: {f.job_id} moved to {f.moved_to} at {reach.clock(f.moved_at)}, but its attempt on {f.host} "
            f"may still run: {f.host} has not answered since; orch stops it at its first contact with {f.host}")


def settle_fences(job_ids: list[str], inventory: Inventory, registry: Registry, say: Callable[[str], None]) -> None:
    """Contact the hosts where ``job_ids`` have superseded attempts not yet stopped: the
    contact stops them (``helper/fence.py``); a host that does not answer is recorded
    (``reach``) and the attempt named (``unfenced``)."""
    waiting = fences.pending(registry.path, job_ids=job_ids)

    def contact(name: str) -> None:
        try:
            host = inventory.get(name)
            with open_transport(host, inventory, never) as transport:
                Remote(host, transport).call("status", jobs=[])
        except HostError as exc:
            reach.record(registry.path, name, ok=False, error=str(exc).splitlines()[0])
        except (UsageError, RemoteError) as exc:
            say(f"warning: {str(exc).splitlines()[0]}")
        else:
            reach.record(registry.path, name, ok=True)

    parallel(contact, sorted({f.host for f in waiting}))
    for f in fences.pending(registry.path, job_ids=job_ids):
        say(unfenced(f))


def probe(record: JobRecord, inventory: Inventory, registry: Registry) -> dict[str, Any]:
    """The job's aggregated status, asked of every node now (raises if a node is unreachable)."""
    hosts = nodes_of(record, inventory)
    per_node = parallel(lambda h: statuses(h, inventory, [record.job_id])[record.job_id], hosts)
    status = _carried(record, job_status(record, _stop_stragglers(record, hosts, inventory, per_node)))
    registry.update(record.job_id, status["state"], status)
    return status


def cancel(record: JobRecord, inventory: Inventory, registry: Registry, grace: float = GRACE_S) -> dict[str, Any]:
    """SIGTERM then SIGKILL on every node at once; returns the aggregated final status."""
    hosts = nodes_of(record, inventory)
    per_node = parallel(lambda h: call_node(h, inventory, "cancel", job=record.job_id, grace=grace,
                                                  timeout=grace + 120), hosts)
    status = aggregate(per_node)
    registry.update(record.job_id, status["state"], status)
    return status


def resume(record: JobRecord, inventory: Inventory, registry: Registry) -> list[str]:
    """Relaunch every node's supervisor (a multi-node job restarts its whole rendezvous), each
    given the values of the job's ``secret_env`` again, read from this laptop's environment.
    Returns what the nodes said the new attempt does with ``launch.resume_args`` (the
    checkpoint ``{last_checkpoint}`` found, or that the script starts over without one),
    each distinct line once, cleaned for a terminal."""
    values = secrets.read(record.secret_env, f"orch resume {record.job_id}")
    status = probe(record, inventory, registry)
    if status["state"] not in RESUMABLE and not status.get("unsupervised"):
        raise UsageError(f"{record.job_id} is {status['state']}; only a failed, lost or cancelled job can be resumed "
                         "(or one whose supervisor died while its processes run: they are stopped first)")
    hosts = nodes_of(record, inventory)
    replies = parallel(lambda h: call_node(h, inventory, "resume", job=record.job_id, whole_job=len(hosts) > 1,
                                           secrets=values), hosts)
    registry.update(record.job_id, "pending", {k: v for k, v in record.detail.items() if k == "log_nodes"})
    notes = [" ".join(clean(r["note"]).split()) for r in replies if isinstance(r.get("note"), str)]
    return list(dict.fromkeys(notes))

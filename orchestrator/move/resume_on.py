"""``orch resume JOB --on HOST``: continue a job on other hosts from its latest complete checkpoint.

The job keeps its id. What moves is ``orchestrator/fetch/kit.py``'s ``gather`` set (the code snapshot, the recorded
spec, the latest complete checkpoint, metrics, logs, outputs), read from the job's own hosts
or, when they cannot be reached, from the laptop's kit (``<run folder>/.orch-job``, kept by
``orch fetch --watch``, found where it recorded it: ``kit_places``). Bytes stream through the laptop from the source's ``send`` into the
target's ``move_receive`` (never stored here); the target checks each file's sha256 before
it takes its final name, and a cut transfer continues where it stopped when the same command
runs again. When every file is there, ``adopt`` makes the job folder with the target's own
job.json (planned as ``orch submit`` plans: the target's python, root, GPUs, Slurm) and starts
it; the trainer resumes from the checkpoint. The attempt on each host left is superseded
(fenced, ``move``): stopped and its folder set aside there, at once or at orch's first
contact with that host. A host that does not answer is left only once it is lost, or with
``--force`` (``gone_for_long``).
"""

from __future__ import annotations

import json
import math
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Iterator

from orchestrator.access.connect import open_transport
from orchestrator.checks import slurm as slurmcheck
from orchestrator.errors import HostError, RemoteError, UsageError
from orchestrator.fetch import kit as movekit
from orchestrator.helper import fence
from orchestrator.helper.remote import Remote
from orchestrator.hosts.inventory import Host, Inventory
from orchestrator.jobs import secrets
from orchestrator.jobs.nodes import parallel
from orchestrator.jobs.pipeline import HostSet, check_rendezvous, checked_plan
from orchestrator.move import direct as movedirect
from orchestrator.plan import slurm as slurmplan
from orchestrator.plan.build import Plan
from orchestrator.spec.load import parse_spec
from orchestrator.state import fences, kits, reach
from orchestrator.state.registry import JobRecord, Registry
from orchestrator.sync import selection
from orchestrator.testhooks import pause
from orchestrator.transport.base import never
from remote_payload.contract.jobfolder import part_rel
from remote_payload.contract.protocol import ACTIVE

Say = Callable[[str], None]
CHUNK = 1 << 20


class Source:
    """Where the moved files come from: the job's hosts, or the laptop's kit."""

    name: str

    def gathered(self) -> movekit.Gathered:
        raise NotImplementedError

    def spec_text(self) -> str:
        raise NotImplementedError

    def stream(self, node: int, requests: list[dict[str, Any]]) -> Iterator[bytes]:
        """``streams.send``'s format for ``requests`` ({path, offset, size}) of node ``node``."""
        raise NotImplementedError


class HostSource(Source):
    def __init__(self, record: JobRecord, remotes: list[Remote | None]) -> None:
        self.job_id, self.remotes = record.job_id, remotes
        self.name = ", ".join(r.host.name for r in remotes if r is not None)
        self._gathered = movekit.gather(remotes, record.job_id)

    def gathered(self) -> movekit.Gathered:
        return self._gathered

    def spec_text(self) -> str:
        remote = self.remotes[self._gathered.primary]
        assert remote is not None
        text = remote.call("show", job=self.job_id).get("spec_text")
        if not isinstance(text, str):
            raise UsageError(f"{self.job_id} has no recorded spec on {remote.host.name}: it cannot be moved")
        return text

    def stream(self, node: int, requests: list[dict[str, Any]]) -> Iterator[bytes]:
        remote = self.remotes[node]
        assert remote is not None
        proc = remote.start("send", job=self.job_id, files=requests)
        while True:
            chunk = proc.read(CHUNK)
            if not chunk:
                break
            yield chunk
        remote.finish(proc, "sending the job's files")


class KitSource(Source):
    def __init__(self, run_dir: Path, record: dict[str, Any]) -> None:
        self.kit, self.record = movekit.kit_dir(run_dir), record
        self.name = f"the laptop's copy in {run_dir}"
        files = movekit.checked_files(record.get("files"), str(self.kit / movekit.RECORD))
        absent = [f["path"] for f in files if not (self.kit / f["path"]).is_file()]
        if absent:
            raise UsageError(f"{self.kit} lacks {len(absent)} file(s) its {movekit.RECORD} names (first: {absent[0]}); "
                             "run orch fetch JOB --watch again while a host still has the job")
        self._gathered = movekit.Gathered([dict(f, node=0) for f in files], 0, record.get("checkpoint"),
                                          int(record.get("attempt") or 0), str(record.get("state") or "unknown"),
                                          list(record.get("links") or []), list(record.get("outside") or []))

    def gathered(self) -> movekit.Gathered:
        return self._gathered

    def spec_text(self) -> str:
        try:
            return (self.kit / "repro" / "spec.yaml").read_text()
        except OSError as exc:
            raise UsageError(f"{self.kit} holds no recorded spec (repro/spec.yaml: {exc.strerror})") from None

    def stream(self, node: int, requests: list[dict[str, Any]]) -> Iterator[bytes]:
        for req in requests:
            with open(self.kit / req["path"], "rb") as f:
                f.seek(req["offset"])
                size = req["size"] - req["offset"]
                yield (json.dumps({"path": req["path"], "offset": req["offset"], "size": size}) + "\n").encode()
                while size:
                    data = f.read(min(size, CHUNK))
                    if not data:
                        raise UsageError(f"{self.kit / req['path']} shrank while it was being sent")
                    yield data
                    size -= len(data)
        yield b'{"end": true}\n'


def kit_places(record: JobRecord, registry: Registry, runs: Path | None) -> list[tuple[Path, str]]:
    """Where to look for the job's laptop copy, in order, each with why: ``--from`` alone when
    given; else where ``orch fetch --watch`` recorded it (``state/kits.py``), then ``./runs``."""
    if runs is not None:
        return [((runs / record.job_id).resolve(), "--from")]
    places = []
    recorded = kits.recorded(registry.path, record.job_id)
    if recorded is not None:
        places.append((recorded, "where orch fetch --watch kept it"))
    here = (Path("runs") / record.job_id).resolve()
    if here not in [p for p, _ in places]:
        places.append((here, "./runs"))
    return places


def gone_for_long(unreachable: dict[str, reach.Reach], job_id: str, force: bool, say: Say) -> None:
    """A move away from hosts that do not answer: allowed once each has failed for
    ``ORCH_LOST_AFTER_S`` (the job shows ``lost``), or now with ``force`` (warned: the job may
    run on both hosts until orch reaches the old one, which then stops it). ``HostError``
    otherwise, saying how long until it is allowed and what ``--force`` risks."""
    after = reach.lost_after_s()
    for name, seen in unreachable.items():
        if reach.is_lost(seen):
            continue
        failing = (seen.last_failure or 0) - (seen.failing_since or 0)
        risk = (f"if {name} is only cut off, {job_id} may still run there, and then runs on both hosts until orch "
                f"reaches {name} again (orch then stops the attempt there)")
        if force:
            say(f"warning: --force: moving {job_id} away from {name}, which has not answered for "
                f"{reach.span(failing)}: {risk}")
            continue
        raise HostError(
            f"{reach.unreachable(seen)}: {job_id} may still run there. A move away from a host that does not answer "
            f"waits until it has failed for {reach.span(after)} (ORCH_LOST_AFTER_S; orch status then shows the job "
            f"lost): run this again in {reach.span(math.ceil(after - failing))}. --force moves it now, at a risk: {risk}")


def open_source(record: JobRecord, inventory: Inventory, registry: Registry, runs: Path | None, stack: ExitStack,
                say: Say, force: bool = False) -> Source:
    """The job's hosts when they answer (a node that does not is left out, named); the kit
    when none does; ``HostError`` naming what was tried when neither is there. Every contact
    is recorded (``reach``); a host that does not answer must be lost (or ``force``):
    ``gone_for_long``."""
    errors: list[str] = []
    unreachable: dict[str, reach.Reach] = {}

    def connect(name: str) -> Remote | None:
        host = inventory.get(name)
        try:
            transport = open_transport(host, inventory, never)
        except (HostError, UsageError) as exc:
            errors.append(str(exc).splitlines()[0])
            if isinstance(exc, HostError):
                unreachable[name] = reach.record(registry.path, name, ok=False, error=errors[-1])
            return None
        reach.record(registry.path, name, ok=True)
        stack.enter_context(transport)
        return Remote(host, transport)

    remotes = parallel(connect, record.hosts)
    if any(r is not None for r in remotes):
        gone_for_long(unreachable, record.job_id, force, say)
        for name, remote in zip(record.hosts, remotes):
            if remote is None:
                say(f"warning: {name} does not answer: its own logs stay behind")
        return HostSource(record, remotes)
    places = kit_places(record, registry, runs)
    found = next(((p, movekit.read_kit(p)) for p, _ in places if movekit.read_kit(p) is not None), None)
    if found is None:
        looked = ", ".join(f"{movekit.kit_dir(p)} ({why})" for p, why in places)
        raise HostError("; ".join(errors) + f". No laptop copy of {record.job_id} either: looked in {looked}. orch "
                        f"fetch {record.job_id} --watch keeps one while the job runs: there is nothing to move the "
                        "job from")
    run_dir, kit = found
    made_on = kit.get("hosts")
    if isinstance(made_on, list) and made_on != record.hosts:
        raise UsageError(f"the laptop's copy in {run_dir} was made on {', '.join(map(str, made_on))}, before "
                         f"{record.job_id} moved to {', '.join(record.hosts)}: that attempt is superseded and its "
                         "files are not the job's; the job's own hosts do not answer, so there is nothing to move "
                         "it from")
    gone_for_long(unreachable, record.job_id, force, say)
    say(f"{', '.join(record.hosts)} cannot be reached ({errors[0]}): moving from {run_dir}")
    return KitSource(run_dir, kit)


def todo_for(have: dict[str, Any], files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``send`` requests for what the target lacks: a verified file is not sent again,
    a partial one continues from its size."""
    todo = []
    for f in files:
        if have["files"].get(f["path"]) == f["sha256"]:
            continue
        offset = have["parts"].get(f["path"], have["parts"].get(part_rel(f["path"], movekit.PART), 0))
        todo.append({"path": f["path"], "offset": offset if isinstance(offset, int) and 0 <= offset <= f["size"] else 0,
                     "size": f["size"]})
    return todo


def expected(files: list[dict[str, Any]], todo: list[dict[str, Any]]) -> list[dict[str, Any]]:
    wanted = {t["path"] for t in todo}
    return [{k: f[k] for k in ("path", "size", "sha256", "mtime_ns")} for f in files if f["path"] in wanted]


def copy(source: Source, node: int, target: Remote, job_id: str, files: list[dict[str, Any]], say: Say,
         direct: bool) -> int:
    """Bring ``files`` (of source node ``node``) to ``target``'s staging folder, through this
    laptop or (``direct``) pulled by the target itself; returns the bytes that had to move."""
    have = target.call("move_have", job=job_id)
    if have["exists"]:
        return 0
    todo = todo_for(have, files)
    need = sum(t["size"] - t["offset"] for t in todo)
    if need > have["free"]:
        raise UsageError(f"{target.host.name} has {have['free'] / 2**30:.1f} GB free under its root; the move needs "
                         f"{need / 2**30:.1f} GB more")
    if not todo:
        return 0
    if direct:
        assert isinstance(source, HostSource)
        say(f"{target.host.name}: copying {len(todo)} file(s), {need / 2**20:.1f} MB directly from "
            f"{source.remotes[node].host.name}")  # type: ignore[union-attr]
        movedirect.pull(source.remotes[node], target, job_id, expected(files, todo), todo)  # type: ignore[arg-type]
        return need
    say(f"{target.host.name}: copying {len(todo)} file(s), {need / 2**20:.1f} MB from {source.name} "
        "(through this laptop)")
    proc = target.start("move_receive", job=job_id, files=expected(files, todo))
    for chunk in source.stream(node, todo):
        proc.write(chunk)
    proc.close_stdin()
    target.finish(proc, "receiving the moved files")
    return need


def move(record: JobRecord, on: list[str], inventory: Inventory, registry: Registry, *, runs: Path | None, say: Say,
         trust: Callable[[str], bool] = never, direct: bool | None = None, force: bool = False,
         why: str | None = None) -> Plan:
    """Move the job to the hosts named ``on`` (one per node it ran on) and start it there.
    ``direct``: True lets each target pull from the source itself where it can reach it
    over SSH, False never, None asks at a terminal (``movedirect.choose``). ``runs``: the
    ``--from`` folder (None: where the kit was recorded, then ./runs). ``force``: move away
    from hosts that do not answer before they count as lost (``gone_for_long``). ``why``: the
    reason recorded with the move in the job's history (the controller's recoveries).

    The hosts left are fenced with the job's new place, in one registry transaction: the
    attempt on each is superseded. Those that answered are fenced at once (the old folder set
    aside); the others at orch's first contact with them (``orchestrator/helper/fence.py``)."""
    if len(on) != len(record.hosts):
        raise UsageError(f"{record.job_id} ran on {len(record.hosts)} node(s) ({', '.join(record.hosts)}): give "
                         f"--on once per node")
    if set(on) & set(record.hosts):
        raise UsageError(f"{record.job_id} already has a folder on {', '.join(sorted(set(on) & set(record.hosts)))}: "
                         f"--on names other hosts (to restart it where it is: orch resume {record.job_id})")
    targets: list[Host] = [inventory.get(name) for name in on]
    secrets.read(record.secret_env, f"orch resume {record.job_id} --on")  # a missing one: before anything connects
    with ExitStack() as stack:
        source = open_source(record, inventory, registry, runs, stack, say, force)
        gathered = source.gathered()
        if isinstance(source, HostSource) and gathered.state in ACTIVE:  # a kit's state is from its last watch
            raise UsageError(f"{record.job_id} is {gathered.state} on {source.name}: stop it first (orch cancel "
                             f"{record.job_id}; the trainer saves a checkpoint when stopped), then move it")
        loaded = parse_spec(source.spec_text(), Path(record.spec_path))
        values = secrets.recorded(loaded.spec.secret_env, record, f"orch resume {record.job_id} --on")
        slurmplan.check_hosts(loaded, targets)
        project = selection.project_name(loaded.workspace_dir)
        connections = HostSet(inventory, registry, trust, stack)  # the submit sequence's connect and hello
        connections.open(targets, project)
        down = connections.first_down(on)
        if down is not None:
            raise down
        remotes, hellos = [connections.remotes[n] for n in on], [connections.hellos[n] for n in on]
        unfenced = [f.host for f in fences.pending(registry.path, job_ids=[record.job_id]) if f.host in on]
        if unfenced:  # the first contact above could not set the old attempt there aside
            raise RemoteError(f"{record.job_id}'s superseded attempt on {', '.join(unfenced)} is not stopped yet "
                              "(see the warning above): the job cannot move back there until it is")
        plan, warnings = checked_plan(loaded, project, remotes, hellos, record.job_id)
        warnings += [f"the job reads {o.get('field')} from {o.get('path')} outside its folder: a move cannot carry it; "
                     f"provide it at the same path on {', '.join(on)}" for o in gathered.outside]
        if gathered.links:
            warnings.append(f"symbolic links are not carried: {', '.join(gathered.links[:5])}")
        for warning in warnings:
            say(f"warning: {warning}")
        if len(remotes) > 1:
            check_rendezvous(remotes, plan, say)
        say(f"moving {record.job_id} to {', '.join(on)}: " + (f"checkpoint {gathered.checkpoint}" if gathered.checkpoint
            else "its folder (no checkpoint of the built-in trainer; a script's own files move with it)"))
        started = time.monotonic()
        per_node = [gathered.files if i == 0 else [f for f in gathered.files if not f["path"].startswith(
            ("checkpoints/", "outputs/"))] for i in range(len(remotes))]  # other nodes: the trainer fans it out
        sent, ways = 0, set()
        try:
            for i, remote in enumerate(remotes):
                for node in sorted({f["node"] for f in per_node[i]}):
                    pull = isinstance(source, HostSource) and movedirect.choose(source.remotes[node], remote, direct, say)
                    sent += copy(source, node, remote, record.job_id, [f for f in per_node[i] if f["node"] == node], say,
                                 pull)
                    ways.add("directly between the servers" if pull else f"through the laptop from {source.name}")
        except (HostError, RemoteError) as exc:
            kind = HostError if isinstance(exc, HostError) else RemoteError
            raise kind(f"{str(exc).rstrip(': ')}. The move stopped; what arrived is kept: run the same command "
                       "again to continue") from None
        moved = {"from": ", ".join(record.hosts), "to": ", ".join(on), "checkpoint": gathered.checkpoint,
                 "attempt": gathered.attempt, "via": ", ".join(sorted(ways)) or "nothing to copy"}
        if why:
            moved["why"] = why

        def adopt(i: int) -> dict[str, Any]:
            request = {"job": plan.job_json(), "train": plan.train, "node_rank": i, "project": project,
                       "secrets": values}
            return remotes[i].call("adopt", request=request, moved=moved, files=[
                {"path": f["path"], "sha256": f["sha256"]} for f in per_node[i]])

        replies = parallel(adopt, range(len(remotes)))
        pause("move-adopted")  # tests: the job started on its new hosts, the registry not yet told
        registry.move(record.job_id, on, plan.job_dir, slurmcheck.log_nodes(plan),
                      superseded=[(name, record.job_dir) for name in record.hosts])
        elapsed = time.monotonic() - started
        say(f"moved {record.job_id} to {', '.join(on)} ({sent / 2**20:.1f} MB in {elapsed:.1f} s)"
            + (f": Slurm job {replies[0]['slurm_job']}" if replies[0].get("slurm_job") else ""))
        fence_old(source, record, say)
        return plan


def fence_old(source: Source, record: JobRecord, say: Say) -> None:
    """Act now on the fences of the hosts left that answered (their folders set aside); name
    those that did not, and when orch will act on them."""
    reached = {r.host.name: r for r in source.remotes if r is not None} if isinstance(source, HostSource) else {}
    for name in record.hosts:
        remote = reached.get(name)
        if remote is not None:
            try:
                fence.settle_on(remote, say)
                continue
            except HostError as exc:
                say(f"warning: {str(exc).splitlines()[0]}")
        say(f"warning: {record.job_id}'s attempt on {name} is superseded, but {name} does not answer: orch stops "
            f"it at its first contact with {name} (any orch command that reaches it) and never reads its files as "
            "the job's")


"""Pure: a validated spec + host facts -> ``Plan`` (what ``orch submit --dry-run`` prints).

No I/O here. The plan holds the exact argv each node's supervisor runs (torchrun's, or for a
one-node one-process job the job's own: ``launch.launcher``); tests compare it exactly. It is
written as the job's ``job.json``, the contract with ``remote_payload``. Its ``queue`` says
what each node waits for in its host's GPU queue (``queue_request``; remote_payload/gpuqueue/queue.py),
its ``budget`` the job's ``max_cost`` with its price (``plan/budget.py``; ``budget.Refused``, exit 2,
when it cannot be enforced).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from datetime import datetime
from typing import Any

from pydantic import Field

from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import Host
from orchestrator.hosts.presets import preset_env, preset_setup
from orchestrator.plan import hidden, launchers
from orchestrator.plan import slurm as slurmplan
from orchestrator.plan.budget import budget
from orchestrator.providers.registry import PRESETS
from orchestrator.spec import commandform
from orchestrator.spec.model import Frozen, JobSpec
from remote_payload.contract.protocol import GRACE_S
from remote_payload.contract.slurm import RDZV

HEARTBEAT_S = 2.0
JOIN_TIMEOUT_S = 300


class HostFacts(Frozen):
    """What ``agent hello`` reported about a host."""

    python: str
    root: str
    gpus: int = 0
    hostname: str = ""
    boot_id: str = ""
    python_version: str = ""
    payload: str = ""
    slurm: dict[str, Any] | None = None  # a Slurm login node: the cluster (remote_payload.slurm.job.host_facts)


class NodePlan(Frozen):
    """One node's part. ``direct``: ``argv`` is the job's one process itself (no torchrun);
    the supervisor adds torchrun's environment contract to it, with a free port it picks —
    unless ``plain``: a command of the user's that orch starts as one process under
    ``launcher: auto``, which sees none of torchrun's variables, as if started with plain
    ``python`` (a framework that starts its own processes reads them as "launched by torchrun")."""

    host: str
    node_rank: int
    nproc: int
    root: str
    job_dir: str
    argv: list[str]
    direct: bool = False
    plain: bool = False
    launcher: str | None = None  # the command's own launcher that orch runs once per node (plan/launchers.py)
    env: dict[str, str] = Field(default_factory=dict)


class Plan(Frozen):
    job_id: str
    name: str
    project: str
    root: str
    job_dir: str
    workspace_dir: str
    nodes: list[NodePlan]
    setup: str | None
    env: dict[str, str]
    outputs: list[str]
    heartbeat_s: float = HEARTBEAT_S
    grace_s: float = GRACE_S
    train: dict[str, Any] | None = None
    on_finish: dict[str, Any]
    spec_sha256: str
    slurm: dict[str, Any] | None = None  # on a Slurm host: env, resources, the batch script (slurmplan.batch)
    queue: dict[str, Any] | None = None  # what each node waits for in its host's GPU queue (queue_request)
    resume_args: list[str] = Field(default_factory=list)  # appended to argv on attempts after the first
    progress: str | None = None  # launch.progress: the script's own progress lines (supervisor/scrape.py)
    rdzv_endpoint: str | None = None  # a multi-node SSH job's rendezvous host:port (every launcher's)
    secret_env: list[str] = Field(default_factory=list)  # names only: the values go in the launch request
    budget: dict[str, Any] | None = None  # max_cost with the job's price per hour (plan/budget.py)
    workdir: str | None = None  # the command's `cd DIR &&`: where it runs, relative to <job_dir>/code (or absolute)

    def job_json(self) -> dict[str, Any]:
        """The document written as ``jobs/<id>/job.json`` (train config goes to train.json)."""
        return self.model_dump(exclude={"train"})


def make_job_id(name: str, now: datetime, entropy: bytes) -> str:
    """``<name>-<yyyymmdd-hhmmss>-<4 hex>``; ``entropy`` makes two submits in a second differ."""
    return f"{name}-{now:%Y%m%d-%H%M%S}-{hashlib.sha256(entropy).hexdigest()[:4]}"


def job_env(spec: JobSpec) -> dict[str, str]:
    """The job's own variables: ``env:``, then the ``NAME=value`` words in front of its command
    (spec/commandform.py), which win as they would in a shell."""
    if spec.launch.command is None:
        return dict(spec.env)
    return {**spec.env, **dict(commandform.read(list(spec.launch.command)).env)}


def visible_gpus(spec: JobSpec, facts: HostFacts) -> int:
    """GPUs the job can use on that node: ``CUDA_VISIBLE_DEVICES`` in the job's env narrows
    what the host reports."""
    visible = job_env(spec).get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return facts.gpus
    return min(facts.gpus, len([d for d in visible.split(",") if d.strip()]))


def nproc_for(spec: JobSpec, facts: HostFacts) -> int:
    """``auto`` = one process per GPU the job gets: ``launch.gpus`` when a number above 0, else
    the node's usable GPUs (1 without GPUs). Raises ``UsageError`` when an explicit count (of
    processes, or of ``launch.gpus``) asks for more GPUs than the node has."""
    gpus = visible_gpus(spec, facts)
    wanted, asked = launchers.wanted_nproc(spec), spec.launch.gpus
    if isinstance(asked, int) and 0 < gpus < asked:
        raise UsageError(f"launch.gpus is {asked} but {facts.hostname or 'the node'} has {gpus} usable GPU(s)")
    if wanted == "auto":
        return asked if isinstance(asked, int) and asked > 0 else max(gpus, 1)
    if 0 < gpus < wanted:
        raise UsageError(f"launch.nproc_per_node is {wanted} but {facts.hostname or 'the node'} has {gpus} usable GPU(s)")
    return wanted


def queue_request(spec: JobSpec) -> dict[str, Any] | None:
    """What each node waits for in its host's GPU queue (job.json's ``queue``), or None when the
    job never queues: ``gpus`` (``launch.gpus``; for ``auto`` the number of processes when
    ``nproc_per_node`` is a number, else ``"all"``: every GPU of the node), ``memory_gb``,
    ``priority``, and ``pinned``: the indices the job's own ``env: CUDA_VISIBLE_DEVICES``
    names — it waits for exactly those. ``gpus: 0`` (a CPU job) and a ``CUDA_VISIBLE_DEVICES``
    that names no indices (empty, or GPU uuids: the job picks its devices itself) never queue."""
    launch = spec.launch
    wanted = launchers.wanted_nproc(spec)
    gpus: int | str = launch.gpus if launch.gpus != "auto" else wanted if isinstance(wanted, int) else "all"
    pinned = None
    visible = job_env(spec).get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        items = [v.strip() for v in visible.split(",") if v.strip()]
        if not items or not all(v.isdigit() and len(v) <= 4 for v in items):
            return None
        pinned = list(dict.fromkeys(int(v) for v in items))  # in the job's order: CUDA numbers them so
        if isinstance(launch.gpus, int) and launch.gpus not in (0, len(pinned)):
            raise UsageError(f"launch.gpus is {launch.gpus} but env CUDA_VISIBLE_DEVICES names {len(pinned)} GPU(s): "
                             "the job waits for exactly those; drop one of the two")
        gpus = len(pinned) if gpus != 0 else 0
    if gpus == 0:
        return None
    return {"gpus": gpus, "memory_gb": launch.memory_gb, "priority": launch.priority, "pinned": pinned}


def refuse_queue_on_slurm(spec: JobSpec, host: Host) -> None:
    """On a Slurm host Slurm is the queue: ``UsageError`` (exit 2) for ``launch.gpus``,
    ``memory_gb`` or ``priority`` set to anything but their defaults, naming what to use there."""
    launch = spec.launch
    if launch.gpus != "auto" or launch.memory_gb is not None or launch.priority != 0:
        raise UsageError(f"launch.gpus, launch.memory_gb and launch.priority are for orch's GPU queue on SSH boxes; "
                         f"{host.name} is a Slurm cluster, whose own queue decides: ask for GPUs with "
                         "launch.slurm.gpus_per_node, memory with launch.slurm.mem, and priority with launch.slurm.qos")


def program(spec: JobSpec, python: str, job_dir: str) -> list[str]:
    """The argv of one process of the job: the built-in trainer or the user's command less its
    leading ``cd DIR &&`` and ``NAME=value`` (spec/commandform.py; a leading ``python``/``python3``
    is the host's python)."""
    if spec.train is not None:
        return [python, "-m", "remote_payload.train", "--config", posixpath.join(job_dir, "train.json"), "--out", job_dir]
    assert spec.launch.command is not None
    command = list(commandform.read(list(spec.launch.command)).argv)
    if command[0] in ("python", "python3"):
        command[0] = python
    return command


def entrypoint(spec: JobSpec, python: str, job_dir: str) -> list[str]:
    """What each torchrun worker runs: the trainer's module arguments (torchrun runs python
    itself), or ``--no-python`` and the user's command."""
    argv = program(spec, python, job_dir)
    return argv[1:] if spec.train is not None else ["--no-python", *argv]


def is_direct(spec: JobSpec, nnodes: int, nproc: int) -> bool:
    """The launcher rule: ``auto`` starts one node × one process directly, anything larger under
    torchrun. Raises ``UsageError`` for ``direct`` with more (``auto`` GPUs can make it so)."""
    launcher = spec.launch.launcher
    if launcher == "direct" and (nnodes > 1 or nproc > 1):
        where = f"the job has {nnodes} nodes" if nnodes > 1 else f"nproc_per_node comes to {nproc}"
        raise UsageError(f"launch.launcher: `direct` starts one process, but {where} — use `torchrun` "
                         "(or `auto`, which picks torchrun for more than one process)")
    return launcher == "direct" or (launcher == "auto" and nnodes == 1 and nproc == 1)


def is_plain(spec: JobSpec, direct: bool) -> bool:
    """A direct start that gets none of torchrun's variables: the user's command under
    ``launcher: auto``. The built-in trainer and ``launcher: direct`` (asked for by name: "torchrun's
    environment without its agent") keep them."""
    return direct and spec.train is None and spec.launch.launcher == "auto"


def torchrun_argv(python: str, nproc: int, entry: list[str], nnodes: int = 1,
                  rdzv_endpoint: str | None = None, run_id: str | None = None) -> list[str]:
    """torchrun with no restarts: ``--standalone`` on one node; across nodes, torch's c10d
    rendezvous at ``rdzv_endpoint`` with the job id as the run id. (c10d orders nodes
    itself, by host name; ``--node_rank`` is for the static backend only, so it is not passed.)"""
    head = [python, "-m", "torch.distributed.run"]
    if nnodes == 1:
        return [*head, "--standalone", "--nnodes", "1", "--nproc_per_node", str(nproc), "--max_restarts", "0", *entry]
    assert rdzv_endpoint and run_id
    return [*head, "--nnodes", str(nnodes), "--nproc_per_node", str(nproc), "--rdzv_backend", "c10d",
            "--rdzv_endpoint", rdzv_endpoint, "--rdzv_id", run_id, "--rdzv_conf", f"join_timeout={JOIN_TIMEOUT_S}",
            "--max_restarts", "0", *entry]


def _once(spec: JobSpec, inner: hidden.Hidden | None) -> bool:
    """The command starts a launcher orch cannot run itself: each node runs it once as written
    (not direct either: the launcher inside gives its processes their environment)."""
    return inner is not None and spec.launch.launcher != "direct"


def rdzv_endpoint(spec: JobSpec, hosts: list[Host], port: int | None) -> str | None:
    """``host:port`` of the rendezvous for a multi-node job (None for one node)."""
    if len(hosts) == 1:
        return None
    port = spec.launch.rdzv_port or port
    if port is None:
        raise ValueError("a multi-node plan needs a rendezvous port")
    return f"{spec.launch.rdzv_host or hosts[0].address}:{port}"


def shutdown_command(spec: JobSpec, presets: list[str]) -> list[str]:
    """The argv that powers a node off: the job's own, a preset's, or ``shutdown -h now``."""
    if spec.on_finish.shutdown_command:
        return list(spec.on_finish.shutdown_command)
    for name in presets:
        if PRESETS[name].shutdown_argv:
            return list(PRESETS[name].shutdown_argv)
    return ["shutdown", "-h", "now"]


def build_plan(spec: JobSpec, spec_text: str, workspace_dir: str, project: str, hosts: list[Host],
               facts: list[HostFacts], job_id: str, rdzv_port: int | None = None, script: str | None = None) -> Plan:
    """The whole plan. ``facts[i]`` belongs to ``hosts[i]``; orch's node index follows that
    order (logs, supervisors); torch's own ranks come from its rendezvous. On a Slurm host
    (the only host then) the nodes are the allocation's (``slurmplan``). ``script``: the text of
    the workspace script the command runs (``hidden.script_path``), when there is one: a launcher
    inside it (or inside ``bash -c``) runs once per node as written, never under orch's torchrun
    (``hidden.Refused`` where that cannot be one world)."""
    slurmplan.refusals(spec, hosts)
    if hosts[0].slurm:
        refuse_queue_on_slurm(spec, hosts[0])
        return _finish(spec, spec_text, workspace_dir, project, hosts, facts[0].root, job_id,
                       *_slurm_nodes(spec, hosts[0], facts[0], job_id, script))
    endpoint = rdzv_endpoint(spec, hosts, rdzv_port)
    inner = hidden.for_spec(spec, script, len(hosts))
    cmd = launchers.for_spec(spec)
    nodes = []
    for rank, (host, fact) in enumerate(zip(hosts, facts)):
        nproc = nproc_for(spec, fact)
        job_dir = posixpath.join(fact.root, "jobs", job_id)
        direct = cmd is None and is_direct(spec, len(hosts), nproc) and not _once(spec, inner)
        if cmd is not None:
            argv = launchers.argv(cmd, launchers.Topology(fact.python, nproc, len(hosts), rank, endpoint, job_id,
                                                          job_dir))
        elif direct or inner is not None:
            argv = program(spec, fact.python, job_dir)
        else:
            argv = torchrun_argv(fact.python, nproc, entrypoint(spec, fact.python, job_dir), len(hosts), endpoint,
                                 job_id)
        nodes.append(NodePlan(host=host.name, node_rank=rank, nproc=nproc, root=fact.root, job_dir=job_dir, argv=argv,
                              direct=direct, plain=is_plain(spec, direct), launcher=cmd.launcher if cmd else None,
                              env={"ORCH_NODE_RANK": str(rank), "ORCH_HOST": host.name,
                                   **launchers.cpu_env(cmd, nproc * len(hosts), visible_gpus(spec, fact), job_env(spec),
                                                       hidden=inner is not None)}))
    plan = _finish(spec, spec_text, workspace_dir, project, hosts, facts[0].root, job_id, nodes, None)
    return plan.model_copy(update={"rdzv_endpoint": endpoint})


def _slurm_nodes(spec: JobSpec, host: Host, fact: HostFacts, job_id: str,
                 script: str | None) -> tuple[list[NodePlan], dict[str, Any]]:
    """The allocation's nodes (one argv for all, run by srun) and the plan's ``slurm`` section."""
    res, nproc = slurmplan.resources(spec, host, fact.slurm or {}, job_id)
    job_dir = posixpath.join(fact.root, "jobs", job_id)
    inner = hidden.for_spec(spec, script, res.nodes)
    cmd = launchers.for_spec(spec)
    if cmd is not None and cmd.launcher != "torchrun" and res.nodes > 1:
        raise UsageError(f"{cmd.launcher} across {res.nodes} Slurm nodes: one argv runs on every node there, and "
                         f"{cmd.launcher} needs each node's rank in its flags — start the script with torchrun "
                         "(or as a plain `python` command, which orch runs under torchrun)")
    direct = cmd is None and is_direct(spec, res.nodes, nproc) and not _once(spec, inner)
    if cmd is not None:
        argv = launchers.argv(cmd, launchers.Topology(fact.python, nproc, res.nodes, 0, RDZV if res.nodes > 1 else None,
                                                      job_id, job_dir))
    elif direct or inner is not None:
        argv = program(spec, fact.python, job_dir)
    else:
        argv = torchrun_argv(fact.python, nproc, entrypoint(spec, fact.python, job_dir), res.nodes, RDZV, job_id)
    nodes = [NodePlan(host=host.name, node_rank=i, nproc=nproc, root=fact.root, job_dir=job_dir, argv=argv,
                      direct=direct, plain=is_plain(spec, direct), launcher=cmd.launcher if cmd else None,
                      env={"ORCH_HOST": host.name})
             for i in range(res.nodes)]
    return nodes, slurmplan.batch(host, res, fact.python, fact.payload, job_dir)


def _finish(spec: JobSpec, spec_text: str, workspace_dir: str, project: str, hosts: list[Host], root: str,
            job_id: str, nodes: list[NodePlan], slurm: dict[str, Any] | None) -> Plan:
    job_dir = nodes[0].job_dir
    presets = list(dict.fromkeys([*hosts[0].presets, *spec.presets]))
    workdir = commandform.read(list(spec.launch.command)).cwd if spec.launch.command else None
    return Plan(
        job_id=job_id, name=spec.name, project=project, root=root, job_dir=job_dir, slurm=slurm,
        workspace_dir=posixpath.join(root, "workspace", project), nodes=nodes,
        setup=preset_setup(presets, spec.setup), env={**preset_env(presets), **job_env(spec)},
        outputs=list(spec.outputs), train=spec.train.model_dump(mode="json") if spec.train else None,
        on_finish=dict(spec.on_finish.model_dump(mode="json"), shutdown_command=shutdown_command(spec, presets),
                       shutdown=spec.on_finish.shutdown or spec.on_finish.power_off,
                       idle_shutdown_minutes=hosts[0].idle_shutdown_minutes),
        spec_sha256=hashlib.sha256(spec_text.encode()).hexdigest(), queue=None if slurm else queue_request(spec),
        resume_args=list(spec.launch.resume_args), progress=spec.launch.progress, secret_env=list(spec.secret_env),
        budget=budget(spec.max_cost, hosts), workdir=workdir,
    )


def plan_text(plan: Plan) -> str:
    return json.dumps(plan.model_dump(mode="json"), indent=2, sort_keys=True)

"""Pure: a validated spec + host facts -> ``Plan`` (what ``orch submit --dry-run`` prints).

No I/O here. The plan holds the exact argv each node's supervisor runs; tests compare it
exactly. It is written as the job's ``job.json``, the contract with ``remote_payload``.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.hosts import Host
from orchestrator.presets import preset_env, preset_setup
from orchestrator.spec import JobSpec

HEARTBEAT_S = 2.0
GRACE_S = 30.0


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HostFacts(_Frozen):
    """What ``agent hello`` reported about a host."""

    python: str
    root: str
    gpus: int = 0
    hostname: str = ""
    boot_id: str = ""
    python_version: str = ""


class NodePlan(_Frozen):
    host: str
    node_rank: int
    nproc: int
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)


class Plan(_Frozen):
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

    def job_json(self) -> dict[str, Any]:
        """The document written as ``jobs/<id>/job.json`` (train config goes to train.json)."""
        return self.model_dump(exclude={"train"})


def make_job_id(name: str, now: datetime, entropy: bytes) -> str:
    """``<name>-<yyyymmdd-hhmmss>-<4 hex>``; ``entropy`` makes two submits in a second differ."""
    return f"{name}-{now:%Y%m%d-%H%M%S}-{hashlib.sha256(entropy).hexdigest()[:4]}"


def nproc_for(spec: JobSpec, facts: HostFacts) -> int:
    wanted = spec.launch.nproc_per_node
    return max(facts.gpus, 1) if wanted == "auto" else wanted


def entrypoint(spec: JobSpec, python: str, job_dir: str) -> list[str]:
    """What each torchrun worker runs: the built-in trainer or the user's command."""
    if spec.train is not None:
        return ["-m", "remote_payload.train", "--config", posixpath.join(job_dir, "train.json"), "--out", job_dir]
    assert spec.launch.command is not None
    command = list(spec.launch.command)
    if command[0] in ("python", "python3"):
        command[0] = python
    return ["--no-python", *command]


def torchrun_argv(python: str, nproc: int, entry: list[str]) -> list[str]:
    """Single-node torchrun (c10d rendezvous on localhost), no restarts."""
    return [python, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc_per_node", str(nproc), "--max_restarts", "0", *entry]


def build_plan(spec: JobSpec, spec_text: str, workspace_dir: str, project: str,
               hosts: list[Host], facts: list[HostFacts], job_id: str) -> Plan:
    """The whole plan. ``facts[i]`` belongs to ``hosts[i]``; node rank follows that order."""
    if len(hosts) != 1:
        raise NotImplementedError("multi-node jobs are not supported yet")
    root = facts[0].root
    job_dir = posixpath.join(root, "jobs", job_id)
    nodes = []
    for rank, (host, fact) in enumerate(zip(hosts, facts)):
        nproc = nproc_for(spec, fact)
        argv = torchrun_argv(fact.python, nproc, entrypoint(spec, fact.python, job_dir))
        nodes.append(NodePlan(host=host.name, node_rank=rank, nproc=nproc, argv=argv,
                              env={"ORCH_NODE_RANK": str(rank), "ORCH_HOST": host.name}))
    presets = list(dict.fromkeys([*hosts[0].presets, *spec.presets]))
    return Plan(
        job_id=job_id, name=spec.name, project=project, root=root, job_dir=job_dir,
        workspace_dir=posixpath.join(root, "workspace", project), nodes=nodes,
        setup=preset_setup(presets, spec.setup), env={**preset_env(presets), **spec.env},
        outputs=list(spec.outputs), train=spec.train.model_dump(mode="json") if spec.train else None,
        on_finish=spec.on_finish.model_dump(mode="json"),
        spec_sha256=hashlib.sha256(spec_text.encode()).hexdigest(),
    )


def plan_text(plan: Plan) -> str:
    return json.dumps(plan.model_dump(mode="json"), indent=2, sort_keys=True)

"""Pure: what a job becomes on a Slurm host (a login node: ``Host.scheduler == "slurm"``).

The job is one Slurm job of ``launch.nnodes`` nodes. Its batch script (``batch``) execs
orch's supervisor on the first node; the supervisor runs each node's ``argv`` there through
one srun step (``remote_payload/supervisor/allocation.py``). ``argv`` is torchrun with a c10d rendezvous
whose endpoint is left as ``contract.slurm.RDZV`` (the first node is known only in the allocation),
``--standalone`` on one node, or the job's one process itself (``direct``).

GPUs per node (``--gres=gpu:N``): ``launch.slurm.gpus_per_node`` when given; else
``nproc_per_node`` when it is a number and the partition has GPUs (0 on a CPU partition);
``auto`` takes every GPU of the partition's nodes and starts one process per GPU (one
process without GPUs).
"""

from __future__ import annotations

import dataclasses
import posixpath
from typing import Any

from orchestrator.errors import SpecError, UsageError
from orchestrator.hosts.inventory import Host
from orchestrator.plan import launchers
from orchestrator.spec.load import LoadedSpec
from orchestrator.spec.model import JobSpec
from orchestrator.spec.slurm import SlurmJob
from remote_payload.contract import slurm
from remote_payload.contract.jobfolder import SUPERVISOR_SCRIPT


def refusal(spec: JobSpec, hosts: list[Host]) -> tuple[tuple[str, ...], str] | None:
    """What a job cannot ask of its hosts, as (the field's key path, the message): a Slurm host
    with others, the fields a Slurm job cannot use, ``launch.nnodes`` on SSH boxes."""
    slurm_hosts = [h.name for h in hosts if h.slurm]
    if not slurm_hosts:
        if spec.launch.nnodes not in (None, len(hosts)):
            return ("launch", "nnodes"), (
                f"launch.nnodes is {spec.launch.nnodes} but the job lists {len(hosts)} SSH host(s), one node each: "
                "list more hosts, or use a Slurm host (orch hosts add ... --scheduler slurm)")
        return None
    if len(hosts) > 1:
        return ("hosts",), (f"{slurm_hosts[0]} is a Slurm cluster: list it alone in hosts (launch.nnodes says how "
                            "many of its nodes the job gets)")
    for field in ("rdzv_host", "rdzv_port"):
        if getattr(spec.launch, field):
            return ("launch", field), (f"launch.{field} does not apply on Slurm: the rendezvous is on the "
                                       "allocation's first node, on a port free there")
    if spec.on_finish.shutdown:
        return ("on_finish", "shutdown"), (f"on_finish.shutdown: {hosts[0].name} is a Slurm cluster, which orch "
                                           "never powers off")
    return None


def refusals(spec: JobSpec, hosts: list[Host]) -> None:
    """``UsageError`` (exit 2) for ``refusal``'s findings."""
    found = refusal(spec, hosts)
    if found:
        raise UsageError(found[1])


def check_hosts(loaded: LoadedSpec, hosts: list[Host]) -> None:
    """``refusal`` as a ``SpecError`` at the field's file:line:col (``orch check``, before ``orch submit`` connects)."""
    found = refusal(loaded.spec, hosts)
    if found:
        raise SpecError(f"{loaded.locate(found[0])}: {found[1]}")


def gpus_and_nproc(spec: JobSpec, cluster: dict[str, Any], partition: str | None) -> tuple[int, int]:
    """(GPUs per node to ask for, processes per node) — see the module docstring."""
    parts = cluster.get("partitions") or {}
    name = partition or next((n for n, p in parts.items() if p.get("default")), None)
    have = int((parts.get(name) or {}).get("max_gpus_per_node") or 0)
    asked = (spec.launch.slurm or SlurmJob()).gpus_per_node
    wanted = launchers.wanted_nproc(spec)
    gpus = asked if asked is not None else (have if wanted == "auto" else wanted if have else 0)
    nproc = max(gpus, 1) if wanted == "auto" else wanted
    if 0 < gpus < nproc:
        raise UsageError(f"launch.nproc_per_node is {nproc} but the job asks Slurm for {gpus} GPU(s) per node "
                         "(launch.slurm.gpus_per_node)")
    return gpus, nproc


def resources(spec: JobSpec, host: Host, cluster: dict[str, Any], job_id: str) -> tuple[slurm.Resources, int]:
    """The Slurm request and the processes per node; ``UsageError`` for values Slurm cannot take."""
    sj = spec.launch.slurm or SlurmJob()
    partition = sj.partition or host.partition
    gpus, nproc = gpus_and_nproc(spec, cluster, partition)
    try:
        res = slurm.Resources(
            nodes=spec.launch.nnodes or 1, gpus_per_node=gpus, cpus_per_task=sj.cpus_per_task, mem=sj.mem,
            time=sj.time, partition=partition, account=sj.account or host.account, qos=sj.qos or host.qos,
            requeue=sj.requeue, signal_before_s=sj.signal_before_s, job_name=job_id)
    except ValueError as exc:
        raise UsageError(f"launch.slurm: {exc}") from None
    return res, nproc


def batch(host: Host, res: slurm.Resources, python: str, payload: str, job_dir: str) -> dict[str, Any]:
    """The plan's ``slurm`` section: the env for Slurm's commands, the request, the exact batch script."""
    if not payload:
        raise UsageError(f"{host.name}: the helper did not say where it lives (an older orch on the host?)")
    supervisor = posixpath.join(payload, *SUPERVISOR_SCRIPT)
    try:
        script = slurm.batch_script(res, job_dir, [python, supervisor, "--job-dir", job_dir, "--node-rank", "0"])
    except ValueError as exc:
        raise UsageError(f"{host.name}: {exc}") from None
    return {"env": dict(host.slurm_env), "resources": dataclasses.asdict(res), "script": script}

"""Laptop-side checks of a job against a Slurm cluster, from what ``hello`` reported.

``job_problems`` runs in ``orch submit`` (and ``--dry-run``) after the plan is made and before
anything is sent: a cluster Slurm cannot be asked about, or a request it can never run (more
GPUs per node than any node has, more nodes than the partition, a longer time limit than it
allows, a partition that does not exist) is a ``RemoteError`` (exit 4) naming what to change.
"""

from __future__ import annotations

from typing import Any

from orchestrator.checks.verdict import FAIL, OK, WARN, Row
from orchestrator.errors import RemoteError, UsageError
from orchestrator.hosts.inventory import Host
from orchestrator.plan import slurm as slurmplan
from orchestrator.plan.build import Plan
from orchestrator.spec.model import JobSpec
from remote_payload.contract import slurm

# Filesystems a login node and its compute nodes commonly share; anything else gets a warning.
SHARED_FS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "fuse.glusterfs", "glusterfs",
             "fuse.sshfs", "panfs", "wekafs", "fuse.juicefs", "cifs", "smb3", "fuse.cvmfs", "pvfs2", "orangefs")


def log_nodes(plan: Plan) -> dict[str, Any]:
    """The registry detail that tells ``orch logs`` how many node logs a Slurm job has."""
    return {"log_nodes": len(plan.nodes)} if plan.slurm else {}


def cluster(host: Host, hello: dict[str, Any]) -> dict[str, Any]:
    """The cluster facts a Slurm host's ``hello`` carried; ``RemoteError`` when Slurm could not be asked."""
    facts = hello.get("slurm")
    if not isinstance(facts, dict):
        raise RemoteError(f"{host.name}: the helper did not describe the Slurm cluster (an older orch on the host?)")
    if "problem" in facts:
        raise RemoteError(f"{host.name}: cannot ask Slurm: {slurm.clean(facts['problem'])} "
                          "(on a cluster that needs `module load slurm`, put it in ~/.bashrc; a private slurm.conf: "
                          "orch hosts add ... --slurm-env SLURM_CONF=/path)")
    return facts


def shared_fs_warning(host: Host, facts: dict[str, Any]) -> str | None:
    kind = str(facts.get("root_fs") or "")
    if kind in SHARED_FS:
        return None
    return (f"{host.name}: orch's root {host.root} is on a {kind or 'unknown'} filesystem, not one compute nodes "
            "usually share (NFS, Lustre, GPFS, ...): jobs read their code and write checkpoints there — choose a root "
            "on the shared filesystem (orch hosts add ... --root) unless you know the nodes see it")


def job_problems(spec: JobSpec, hosts: list[Host], hellos: list[dict[str, Any]], plan: Plan) -> list[str]:
    """Warnings for a Slurm job (none for SSH boxes, except a ``launch.slurm`` that does not
    apply there); raises ``RemoteError`` when the cluster can never run the request."""
    if not hosts[0].slurm:
        return ["launch.slurm applies to Slurm hosts only: ignored on " + ", ".join(h.name for h in hosts)] \
            if spec.launch.slurm is not None else []
    assert plan.slurm is not None
    facts = cluster(hosts[0], hellos[0])
    res = slurm.Resources(**plan.slurm["resources"])
    problem = slurm.fits(facts, res)
    if problem:
        said = f"it {problem}" if problem.startswith("asks") else problem
        raise RemoteError(f"{hosts[0].name}: Slurm could never run this job: {said}. Change launch.nnodes, "
                          "launch.nproc_per_node or launch.slurm (see `orch hosts check "
                          f"{hosts[0].name}` for the partitions)")
    warning = shared_fs_warning(hosts[0], facts)
    return [warning] if warning else []


def preflight_rows(host: Host, facts: Any, spec: JobSpec | None) -> list[Row]:
    """``orch hosts check`` / ``orch check --remote`` rows for a Slurm login node: Slurm
    answers, each partition (nodes, GPUs per node from gres, CPUs, memory, time limit, state),
    the root's filesystem, and with a job, whether the cluster can ever run its request."""
    if not isinstance(facts, dict) or "problem" in facts:
        problem = facts.get("problem") if isinstance(facts, dict) else "no answer"
        return [Row("slurm", "not answering", FAIL, slurm.clean(problem))]
    rows = [Row("slurm", f"{slurm.clean(facts.get('version'))}, accounting "
                         f"{'on' if facts.get('accounting') else 'off (states from scontrol/squeue)'}", OK)]
    parts = facts.get("partitions") if isinstance(facts.get("partitions"), dict) else {}
    for name, p in list(parts.items())[:30]:
        if not isinstance(p, dict):
            continue
        groups = [g for g in p.get("groups") or [] if isinstance(g, dict)]
        shapes = "; ".join(f"{g.get('nodes')} × {g.get('gpus')} GPU, {g.get('cpus')} CPU, "
                           f"{int(g.get('mem_mb') or 0) // 1024} GiB" for g in groups[:4])
        up = p.get("state") == "up"
        rows.append(Row("partition", f"{slurm.clean(name)}{' (default)' if p.get('default') else ''}: {shapes}, "
                                     f"max time {slurm.clean(p.get('max_time'))}", OK if up else WARN,
                        "" if up else f"state {slurm.clean(p.get('state'))}"))
    if not parts:
        rows.append(Row("partition", "none", FAIL, "sinfo lists no partition"))
    warning = shared_fs_warning(host, facts)
    rows.append(Row("shared root", f"{host.root} on {slurm.clean(facts.get('root_fs')) or '?'}",
                    WARN if warning else OK, "compute nodes must see this folder" if warning else ""))
    if spec is not None:
        try:
            res, nproc = slurmplan.resources(spec, host, facts, spec.name)
        except UsageError as exc:
            return rows + [Row("job request", "invalid", FAIL, str(exc))]
        problem = slurm.fits(facts, res)
        value = f"{res.nodes} node(s) × {nproc} process(es), {res.gpus_per_node} GPU(s)/node, " \
                f"time {res.time or 'partition default'}"
        rows.append(Row("job request", value, FAIL if problem else OK, problem or ""))
    return rows

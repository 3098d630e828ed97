"""Each host's GPU queue as its helper reports it (``orch queue``; the server's side is
``remote_payload/gpuqueue/queue.py``, docs/queue.md).

The ``queue`` reply is untrusted: every GPU and job row is checked against ``GPU_ROW`` /
``JOB_ROW`` (``checked``; a malformed one is ``RemoteError`` naming the host, exit 4). Which
hosts to ask without a name is ``hosts_to_ask`` (the registry's unfinished jobs' hosts);
``ask`` asks several in parallel and keeps each host's failure in its place, so one host that
cannot be asked never hides the others. Nothing here prints; the host modules are loaded only
when a host is asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.errors import OrchError, RemoteError, UsageError
from orchestrator.state.registry import TERMINAL, Registry
from remote_payload.contract.protocol import NONE, NUMBER, OPT, REQUIRED, ProtocolError, Shape, check_shape

if TYPE_CHECKING:
    from orchestrator.hosts.inventory import Host, Inventory

GPU_ROW: Shape = {"index": (int, REQUIRED), "uuid": (str, REQUIRED), "total_mib": ((int, NONE), OPT),
                  "used_mib": ((int, NONE), OPT), "busy": (bool, REQUIRED), "holder": ((str, NONE), OPT)}
JOB_ROW: Shape = {"job_id": (str, REQUIRED), "node_rank": (int, REQUIRED), "state": (str, REQUIRED),
                  "gpus": (list, REQUIRED), "need": ((int, str), REQUIRED), "memory_gb": ((int, float, NONE), OPT),
                  "priority": (int, REQUIRED), "since": (NUMBER, REQUIRED), "granted": ((int, float, NONE), OPT),
                  "position": ((int, NONE), OPT), "unsupervised": (bool, OPT)}


def checked(host: str, reply: dict[str, Any]) -> dict[str, Any]:
    """``reply`` with each GPU and job row checked; ``RemoteError`` naming the host otherwise."""
    try:
        for i, gpu in enumerate(reply["gpus"]):
            check_shape(f"GPU row {i}", gpu, GPU_ROW)
        for i, job in enumerate(reply["jobs"]):
            check_shape(f"job row {i}", job, JOB_ROW)
            if job["state"] not in ("running", "waiting") or not all(type(g) is int for g in job["gpus"]):
                raise ProtocolError(f"job row {i}: state {job['state'][:20]!r} or its GPUs are not the queue's")
    except ProtocolError as exc:
        raise RemoteError(f"{host}: orch's helper answered queue with a malformed reply: {exc}") from None
    return reply


def hosts_to_ask(registry: Registry, host: str | None) -> list[str]:
    """``[host]`` when one is named; else the hosts of the registry's unfinished jobs, each once,
    in the order the jobs name them (empty when every job has finished)."""
    if host is not None:
        return [host]
    names: list[str] = []
    for record in registry.all():
        if record.state not in TERMINAL:
            names += [n for n in record.hosts if n not in names]
    return names


def ask(hosts: list[Host], inventory: Inventory) -> list[dict[str, Any] | OrchError]:
    """Each host's checked ``queue`` reply, asked in parallel on a connection of its own, or
    the ``OrchError`` that host failed with, in ``hosts``' order. ``UsageError`` (exit 2), and
    no host asked, when one of them is a Slurm cluster: its queue is Slurm's."""
    for h in hosts:
        if h.slurm:
            raise UsageError(f"{h.name} is a Slurm cluster: its queue is Slurm's (orch exec {h.name} -- squeue)")
    from orchestrator.jobs.nodes import call_node, parallel

    def one(h: Host) -> dict[str, Any] | OrchError:
        try:
            return checked(h.name, call_node(h, inventory, "queue", timeout=60))
        except OrchError as exc:
            return exc

    return parallel(one, hosts)

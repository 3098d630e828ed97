"""Where ``orch tunnel`` forwards to: a host, or a job's first node.

``JOB|HOST``: an inventory name (``local`` included) is the host; anything else is a job id (or a
unique prefix of one) of the laptop's records, reached on its first host — its ``launch.ports``
are what it opens when no port is named. A Slurm job's ports are on the compute node the job runs
on (its batch host, the first node), which the login node reaches: ``node`` asks Slurm there each
time the connection is made, so a requeued job is followed to its new node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator.errors import RemoteError, UsageError
from orchestrator.hosts.inventory import Host, Inventory
from orchestrator.state.registry import JobRecord, Registry
from orchestrator.transport import shell
from orchestrator.transport.base import Transport

LOCALHOST = "localhost"  # the box itself, as `ssh -L 6006:localhost:6006` names it


@dataclass(frozen=True)
class Target:
    """The host to connect to, and the job when one was named."""

    host: Host
    job: JobRecord | None = None

    @property
    def label(self) -> str:
        return f"{self.job.job_id} on {self.host.name}" if self.job else self.host.name

    def node(self, transport: Transport) -> str:
        """The address a bare ``PORT`` means, as the connected host sees it: ``localhost``, or
        the compute node a Slurm job runs on now (``RemoteError`` while it runs nowhere)."""
        if self.job is None or not self.host.slurm:
            return LOCALHOST
        return slurm_node(self.host, self.job, transport)


def resolve(name: str, inventory: Inventory, registry: Registry) -> Target:
    """``name`` as a host (inventory names first) or as a job; ``UsageError`` for neither."""
    if name == "local" or name in inventory.names():
        return Target(inventory.get(name))
    try:
        record = registry.get(name)
    except UsageError:
        known = ", ".join(["local", *inventory.names()])
        raise UsageError(f"{name!r} is neither a host ({known}) nor a job of `orch ls`") from None
    return Target(inventory.get(record.hosts[0]), record)


def slurm_node(host: Host, job: JobRecord, transport: Transport) -> str:
    """The address of the batch host (first node) of the job's latest Slurm job, from
    ``scontrol`` on the login node with the host's Slurm environment: the node's ``NodeAddr``
    (its name when Slurm gives no other address)."""
    from orchestrator.helper.remote import Remote

    remote = Remote(host, transport)
    try:
        status = remote.call("status", jobs=[job.job_id])["jobs"].get(job.job_id) or {}
    finally:
        remote.close()  # its helper session; the connection stays for the tunnel
    slurm_job = status.get("slurm_job")
    if not isinstance(slurm_job, str) or not slurm_job:
        raise RemoteError(f"{job.job_id} has no Slurm job on {host.name} yet ({status.get('state', 'unknown')})")
    env = [f"{key}={value}" for key, value in sorted(host.slurm_env.items())]
    done = transport.run(shell.login_argv(["env", *env, "scontrol", "show", "job", "-o", slurm_job]), timeout=60)
    text = done.stdout.decode("utf-8", "replace")
    state = re.search(r"\bJobState=(\S+)", text)
    batch = re.search(r"\bBatchHost=(\S+)", text)
    if done.exit_code != 0 or state is None:
        said = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()[-1:] or ["no answer"]
        raise RemoteError(f"{host.name}: scontrol show job {slurm_job} failed: {said[0]}")
    if state.group(1) != "RUNNING" or batch is None or batch.group(1) in ("", "(null)"):
        raise RemoteError(f"{job.job_id}: Slurm job {slurm_job} is {state.group(1)}, on no node yet: "
                          "its ports can be reached once it runs")
    node = batch.group(1)
    # The node's address as Slurm reaches it (NodeAddr), which the login node may know where it
    # cannot resolve the node's name; the name when Slurm says no other.
    shown = transport.run(shell.login_argv(["env", *env, "scontrol", "show", "node", "-o", node]), timeout=60)
    addr = re.search(r"\bNodeAddr=(\S+)", shown.stdout.decode("utf-8", "replace")) if shown.exit_code == 0 else None
    return addr.group(1) if addr and addr.group(1) not in ("", "(null)") else node

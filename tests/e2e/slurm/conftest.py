"""Real Slurm clusters for the Slurm tests (tests/support/slurm.py), one of each per session:

* ``slurm``: slurmctld and one slurmd on this machine (node = this machine's short hostname);
* ``slurm2``: slurmctld here, two slurmds in network namespaces (``node1``, ``node2``);
* ``slurm_login`` / ``slurm2_login``: the loopback sshd as their login node.

Both clusters have 2 fake GPUs per node (``--gres=gpu:N``). Jobs a test leaves behind are
cancelled after it, and the next test starts with every node idle."""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from tests.support.slurm import SlurmCluster, SlurmLogin, start_slurm
from tests.support.sshd import SSHServer
from tests.support.tiers import needs


def settle(cluster: SlurmCluster, timeout: float = 60) -> None:
    """Cancel whatever is still queued or running, then wait for an empty queue and idle nodes."""
    cluster.cancel_all()
    deadline = time.monotonic() + timeout
    while cluster.run("squeue", "-h", "-o", "%A", check=False).stdout.split():
        if time.monotonic() > deadline:
            raise AssertionError(f"jobs left after scancel:\n{cluster.run('squeue', check=False).stdout}")
        time.sleep(0.2)
    cluster.wait_idle(max(1.0, deadline - time.monotonic()))


@pytest.fixture(scope="session")
@needs("slurm")
def slurm_cluster() -> Iterator[SlurmCluster]:
    cluster = start_slurm(gpus=2)
    yield cluster
    cluster.teardown()


@pytest.fixture(scope="session")
@needs("slurm", "netns")
def slurm2_cluster() -> Iterator[SlurmCluster]:
    cluster = start_slurm(netns=2, gpus=2)
    yield cluster
    cluster.teardown()


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    yield slurm_cluster
    settle(slurm_cluster)


@pytest.fixture
def slurm2(slurm2_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    yield slurm2_cluster
    settle(slurm2_cluster)


@pytest.fixture
def slurm_login(slurm: SlurmCluster, sshd: SSHServer) -> SlurmLogin:
    return SlurmLogin(sshd.port, sshd.client_key, slurm)


@pytest.fixture
def slurm2_login(slurm2: SlurmCluster, sshd: SSHServer) -> SlurmLogin:
    return SlurmLogin(sshd.port, sshd.client_key, slurm2)

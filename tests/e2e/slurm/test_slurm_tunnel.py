"""``orch tunnel`` to a Slurm job: its port on the compute node it runs on (a node in a network
namespace of its own, which only its address reaches), through the login node, at the printed
local URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.slurm.test_slurm_jobs import add_lab
from tests.support.orch import Orch
from tests.support.slurm import SlurmCluster, SlurmLogin
from tests.support.sshd import free_port
from tests.support.tunnel import Running, fetched


@pytest.fixture
def lab2(orch: Orch, slurm2_login: SlurmLogin) -> str:
    return add_lab(orch, slurm2_login, "lab2")


def test_a_slurm_jobs_port_is_reached_on_its_node_through_the_login_node(
        orch: Orch, lab2: str, slurm2: SlurmCluster, tmp_path: Path) -> None:
    port = free_port()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "token.txt").write_text("served on the compute node")
    spec = tmp_path / "web.yaml"
    spec.write_text(f"name: web\nworkspace: {{path: ws}}\nhosts: [{lab2}]\n"
                    f"launch: {{nnodes: 1, nproc_per_node: 1, ports: [{port}], "
                    f"command: python -m http.server {port}, slurm: {{time: '5'}}}}\n")
    job = orch("submit", str(spec)).stdout.strip().splitlines()[-1]
    assert orch.wait_state(job, ("running",), timeout=180)["state"] == "running"
    node = slurm2.run("squeue", "-h", "-o", "%B").stdout.split()[0]  # the node Slurm put it on
    address = next(n.address for n in slurm2.nodes if n.name == node)
    tunnel = Running(orch, "tunnel", job, "--local", "0")
    try:
        (url, _), = tunnel.urls()
        assert f"-> {address}:{port} on {job} on {lab2}" in tunnel.stdout  # its address, from the login node
        fetched(f"{url}/token.txt", "served on the compute node")
        assert tunnel.interrupt() == 130
    finally:
        tunnel.stop()
        orch("cancel", job)

"""``orch tunnel`` to a Slurm job: its port on the compute node it runs on, reached through the
login node (the node asked of Slurm), at the printed local URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.slurm.test_slurm_jobs import add_lab
from tests.support.orch import Orch
from tests.support.slurm import SlurmCluster, SlurmLogin
from tests.support.sshd import free_port
from tests.support.tunnel import Running, fetched


@pytest.fixture
def lab(orch: Orch, slurm_login: SlurmLogin) -> str:
    return add_lab(orch, slurm_login)


def test_a_slurm_jobs_port_is_reached_on_its_node_through_the_login_node(
        orch: Orch, lab: str, slurm: SlurmCluster, tmp_path: Path) -> None:
    port = free_port()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "token.txt").write_text("served on the compute node")
    spec = tmp_path / "web.yaml"
    spec.write_text(f"name: web\nworkspace: {{path: ws}}\nhosts: [{lab}]\n"
                    f"launch: {{nproc_per_node: 1, ports: [{port}], command: python -m http.server {port}, "
                    "slurm: {time: '5'}}\n")
    job = orch("submit", str(spec)).stdout.strip().splitlines()[-1]
    assert orch.wait_state(job, ("running",), timeout=180)["state"] == "running"
    node = slurm.run("squeue", "-h", "-o", "%B", check=False).stdout.split()
    tunnel = Running(orch, "tunnel", job, "--local", "0")
    try:
        (url, _), = tunnel.urls()
        assert node and f"-> {node[0]}:{port} on {job} on {lab}" in tunnel.stdout  # the node Slurm put it on
        fetched(f"{url}/token.txt", "served on the compute node")
        assert tunnel.interrupt() == 130
    finally:
        tunnel.stop()
        orch("cancel", job)

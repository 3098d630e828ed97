"""A job moved onto a Slurm cluster (issue 14): stopped on a plain host, `orch resume --on`
a Slurm login node continues it in an allocation from its checkpoint, bit-identical."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.slurm.test_slurm_jobs import add_lab
from tests.support.moves import assert_same_run, reference_and_stopped
from tests.support.orch import Orch
from tests.support.slurm import SlurmCluster, SlurmLogin


def test_a_job_stopped_on_a_box_continues_on_slurm_bit_identical(orch: Orch, slurm: SlurmCluster,
                                                                  slurm_login: SlurmLogin, tiny_assets: Path) -> None:
    lab = add_lab(orch, slurm_login)
    ref, job, _, _ = reference_and_stopped(orch, tiny_assets)

    out = orch("resume", job, "--on", lab, "--follow", timeout=600, check=None)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Slurm job" in out.stderr
    status = orch.json("status", job)
    assert status["state"] == "succeeded" and status["hosts"] == [lab]
    assert_same_run(orch, ref, job)

"""A job moved onto a Slurm cluster (issue 14): stopped on a plain host, `orch resume --on`
a Slurm login node continues it in an allocation from its checkpoint, bit-identical."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.conftest import Orch
from tests.movehelp import adapter, steps_logged, trainer_spec, wait_for
from tests.slurm import SlurmCluster, SlurmLogin
from test_slurm_jobs import add_lab


def test_a_job_stopped_on_a_box_continues_on_slurm_bit_identical(orch: Orch, slurm: SlurmCluster,
                                                                  slurm_login: SlurmLogin, tiny_assets: Path) -> None:
    lab = add_lab(orch, slurm_login)
    ref = json.loads(orch("submit", str(trainer_spec(orch, tiny_assets, "local", "ref")), "--follow", "--json",
                          timeout=600).stdout)
    assert ref["state"] == "succeeded"
    job = json.loads(orch("submit", str(trainer_spec(orch, tiny_assets, "local", "mv", delay=0.5)), "--json").stdout)["job_id"]
    old_dir = orch.job_dir(job)
    wait_for(lambda: (old_dir / "checkpoints" / "step-3" / "COMPLETE").exists(), "the first checkpoint")
    orch("cancel", job)

    out = orch("resume", job, "--on", lab, "--follow", timeout=600, check=None)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Slurm job" in out.stderr
    status = orch.json("status", job)
    assert status["state"] == "succeeded" and status["hosts"] == [lab]
    for j in (ref["job_id"], job):
        orch("fetch", j)
    a, b = adapter(orch.cwd / "runs" / ref["job_id"]), adapter(orch.cwd / "runs" / job)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert steps_logged(orch.cwd / "runs" / job) == list(range(1, 13))

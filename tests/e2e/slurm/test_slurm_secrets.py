"""``secret_env`` on a real two-node Slurm cluster (issue 23, class 5): the value goes to sbatch
in its environment only, reaches every task of every node in the allocation, on the first
submission and on ``orch resume`` (a new Slurm job), and is in no file orch wrote: not in
``slurm.sh``, not in Slurm's output files, not in the job folder."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

from tests.e2e.slurm.test_slurm_jobs import add_lab, job_file
from tests.support.orch import Orch
from tests.support.slurm import SlurmLogin

TASK = """\
import hashlib, os, sys, time
token = os.environ.get("HF_TOKEN", "")
print("rank %s node %s digest %s" % (os.environ.get("RANK"), os.environ.get("SLURM_NODEID"),
      hashlib.sha256(token.encode()).hexdigest()[:16]), flush=True)
time.sleep(2)  # every task prints before the first one's exit ends the step
sys.exit(3 if os.environ["ORCH_ATTEMPT"] == "1" else 0)
"""


def test_a_secret_reaches_every_node_of_an_allocation_and_no_file_holds_it(
        orch: Orch, slurm2_login: SlurmLogin, tmp_path: Path) -> None:
    lab = add_lab(orch, slurm2_login, "lab2")
    spec = job_file(tmp_path, "sec", f"hosts: [{lab}]\nsecret_env: [HF_TOKEN]\nlaunch:\n  nnodes: 2\n"
                                     "  nproc_per_node: 1\n  command: python job.py\n  slurm: {time: '5'}\n", TASK)
    token = "hf_" + os.urandom(12).hex()
    digest = hashlib.sha256(token.encode()).hexdigest()[:16]
    first = json.loads(orch("submit", str(spec), "--follow", "--json", env={"HF_TOKEN": token}, timeout=600,
                            check=1).stdout)
    assert first["state"] == "failed", first  # attempt 1 fails on purpose: resume must deliver it again
    orch("resume", first["job_id"], "--follow", env={"HF_TOKEN": token}, timeout=600)
    job_dir = orch.remote_root / "jobs" / first["job_id"]
    for node in ("0", "1"):  # both nodes, both Slurm jobs
        log = (job_dir / "logs" / f"node{node}.log").read_text()
        assert log.count(f"node {node} digest {digest}") == 2, log
    assert "HF_TOKEN" not in (job_dir / "slurm.sh").read_text()
    for root in (orch.remote_root, orch.home):
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert token not in path.read_bytes().decode("latin-1"), path
    for path in (job_dir / "logs").iterdir():  # Slurm's own output files too: the submitter's umask
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path

"""``secret_env`` across two network namespaces (issue 23, class 5): every worker of every node
gets the value, and nothing orch wrote on either node holds it."""

from __future__ import annotations

import hashlib
import json
import os
import stat

from tests.e2e.multinode.test_multinode import two_nodes  # noqa: F401 (fixture)
from tests.support.orch import Orch

WORKER = """\
import hashlib, os, pathlib
os.makedirs("outputs", exist_ok=True)
token = os.environ.get("HF_TOKEN", "")
pathlib.Path("outputs/rank%s.txt" % os.environ["RANK"]).write_text(hashlib.sha256(token.encode()).hexdigest())
"""


def test_every_worker_on_every_node_gets_the_secret_and_no_node_keeps_it(
        orch: Orch, two_nodes: list[str]) -> None:  # noqa: F811
    ws = orch.cwd / "ws"
    ws.mkdir()
    (ws / "worker.py").write_text(WORKER)
    spec = orch.cwd / "sec.yaml"
    spec.write_text(json.dumps({"name": "sec", "hosts": two_nodes, "workspace": {"path": "ws"},
                                "secret_env": ["HF_TOKEN"],
                                "launch": {"nproc_per_node": 2, "command": "python worker.py"}}))
    token = "hf_" + os.urandom(12).hex()
    job = json.loads(orch("submit", str(spec), "--follow", "--json", env={"HF_TOKEN": token}, timeout=600).stdout)
    assert job["state"] == "succeeded", job
    orch("fetch", job["job_id"])
    out = orch.cwd / "runs" / job["job_id"] / "outputs"
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert {p.name: p.read_text() for p in out.glob("rank*.txt")} == {f"rank{r}.txt": digest for r in range(4)}
    for root in [orch.remote_root / name for name in two_nodes] + [orch.home]:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert token not in path.read_bytes().decode("latin-1"), path
    job_dir = orch.remote_root / two_nodes[1] / "jobs" / job["job_id"]
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((job_dir / "job.json").stat().st_mode) == 0o600

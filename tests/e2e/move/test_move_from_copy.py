"""When the job's server is gone (issue 14): the copy `orch fetch --watch` kept on the laptop is
enough to move the job with `orch resume --on`, and the run ends bit-identical to one never
interrupted. The "deleted instance" is a host behind the fault proxy: the proxy is closed, the
job's processes killed and its folder removed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

from tests.support.moves import assert_same_run, trainer_spec
from tests.support.orch import Orch
from tests.support.poll import wait_until
from tests.support.proxy import FaultProxy


def test_a_job_moves_from_the_laptops_watched_copy_when_its_server_is_gone(
        orch: Orch, flaky: str, proxy: FaultProxy, box2: str, tiny_assets) -> None:
    ref = json.loads(orch("submit", str(trainer_spec(orch, tiny_assets, "local", "ref")), "--follow", "--json",
                          timeout=600).stdout)
    job = json.loads(orch("submit", str(trainer_spec(orch, tiny_assets, flaky, "mv", delay=0.6)), "--json").stdout)["job_id"]
    watch = subprocess.Popen([sys.executable, "-m", "orchestrator", "fetch", job, "--watch", "--interval", "0.5"],
                             cwd=orch.cwd, env=orch.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    kit = orch.cwd / "runs" / job / ".orch-job"

    def kit_checkpoint() -> str | None:
        try:
            return json.loads((kit / "move.json").read_text()).get("checkpoint")
        except (OSError, ValueError):
            return None

    wait_until(lambda: kit_checkpoint() is not None, what="a checkpoint in the laptop's copy", timeout=300)
    server_dir = orch.remote_root / "jobs" / job
    status = json.loads((server_dir / "status.json").read_text())
    proxy.close()  # the instance is deleted: unreachable, its processes and files gone
    os.kill(status["supervisor_pid"], signal.SIGKILL)
    os.killpg(status["pgid"], signal.SIGKILL)
    watch.terminate()
    watch.wait(timeout=60)
    record = json.loads((kit / "move.json").read_text())
    shutil.rmtree(server_dir)
    step = int(record["checkpoint"].rsplit("-", 1)[1])
    assert step < 12 and all((kit / f["path"]).is_file() for f in record["files"])
    assert not list(kit.rglob("*.orch-part"))

    plain = orch("resume", job, check=3)
    assert f"orch resume {job} --on OTHER_HOST" in plain.stderr

    gone = {"ORCH_LOST_AFTER_S": "0"}  # the host counts as lost at its first failed contact (test_move_fence.py waits)
    out = orch("resume", job, "--on", box2, "--follow", timeout=600, env=gone)
    assert f"moving from {orch.cwd / 'runs' / job}" in out.stderr or "moving from runs/" in out.stderr
    assert f"checkpoint {record['checkpoint']}" in out.stderr
    assert orch.json("status", job)["state"] == "succeeded"
    assert_same_run(orch, ref["job_id"], job)
    assert "via the laptop's copy" in orch("show", job).stdout or "laptop's copy" in orch("show", job).stdout

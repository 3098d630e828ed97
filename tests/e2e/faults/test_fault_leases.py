"""Locks on the server are leases: a sync whose link froze (the server still thinks the
connection is alive) does not block the workspace's next sync."""

from __future__ import annotations

import json
import os
from pathlib import Path

from remote_payload.jobdir import lease
from tests.e2e.faults.conftest import start_paused
from tests.support.orch import Orch, write_job
from tests.support.proxy import FaultProxy


def test_a_sync_frozen_mid_stream_does_not_block_the_next_one(orch: Orch, flaky: str, proxy: FaultProxy,
                                                              tmp_path: Path) -> None:
    spec = write_job(orch.cwd, "lease", flaky, ["python", "-c", "print('ran after the takeover')"])
    for i in range(10):
        (orch.cwd / "ws" / f"shard-{i}.bin").write_bytes(os.urandom(300_000))
    hooks = tmp_path / "hooks"
    first = start_paused(orch, spec, "sync-stream", hooks)
    proxy.freeze()  # the server's receiver now holds the lock and waits on a link that answers nothing
    (hooks / "sync-stream.go").touch()
    _, err = first.communicate(timeout=120)
    assert first.returncode == 3 and "stalled" in err and "Traceback" not in err, err
    ws = orch.server_workspace(orch.cwd / "ws")
    stuck = lease.holder(str(orch.remote_root / "state" / f"sync-{ws.name}.json.lock"))
    assert stuck is not None, "the frozen receiver should still hold the workspace's lock on the server"
    done = orch("submit", str(spec), "--follow", "--json", env={"ORCH_LEASE_STALL_S": "3"}, timeout=120)
    assert json.loads(done.stdout)["state"] == "succeeded"
    assert "an earlier sync of this workspace" in done.stderr and "still holds its lock" in done.stderr
    assert "ran after the takeover" in orch("logs", json.loads(done.stdout)["job_id"]).stdout
    assert not list(ws.glob(".orch-tmp-*")) and len(list(ws.glob("shard-*.bin"))) == 10


def test_a_launch_frozen_mid_request_does_not_lock_out_other_jobs(orch: Orch, flaky: str, proxy: FaultProxy,
                                                                  tmp_path: Path) -> None:
    frozen = write_job(orch.cwd, "frozen", flaky, ["python", "-c", "print('never')"])
    hooks = tmp_path / "hooks"
    first = start_paused(orch, frozen, "launch-half-sent", hooks)
    proxy.freeze()  # the server's launch request never ends: the helper waits for the rest of it
    (hooks / "launch-half-sent.go").touch()
    other = orch.cwd / "other"
    other.mkdir()
    spec = write_job(other, "other", flaky, ["python", "-c", "print('other job ran')"])
    done = json.loads(orch("submit", str(spec), "--follow", "--json", timeout=120).stdout)
    assert done["state"] == "succeeded"
    first.communicate(timeout=120)
    assert first.returncode == 3

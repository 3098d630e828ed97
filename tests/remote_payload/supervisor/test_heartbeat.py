"""A supervisor's heartbeat survives a transient error on its job folder (an ``ESTALE`` on
NFS): the real ``Supervisor`` of remote_payload/supervisor/supervisor.py on a real job folder,
its heartbeat duty on its own thread, with status.json's write failing once in between. The
duties' policy itself: tests/remote_payload/jobdir/test_duties.py."""

from __future__ import annotations

import errno
import json
import threading
from pathlib import Path
from typing import Any, List

import pytest

from remote_payload.supervisor import supervisor as module
from remote_payload.supervisor.supervisor import Supervisor

WAIT_S = 60.0  # an upper bound for a thread to get its turn on a loaded machine, never a measured time


def job_folder(tmp_path: Path) -> Path:
    job_dir = tmp_path / "root" / "jobs" / "hb-1"
    job_dir.mkdir(parents=True)
    job = {"job_id": "hb-1", "nodes": [{"argv": ["python", "-c", "pass"]}], "heartbeat_s": 0.01}
    (job_dir / "job.json").write_text(json.dumps(job))
    return job_dir


def test_the_heartbeat_goes_on_after_a_stale_file_handle_and_says_so_once(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    job_dir = job_folder(tmp_path)
    status = str(job_dir / "status.json")
    real_write = module.atomic_write_json
    writes: List[str] = []  # "ok" or "stale", one per write of status.json
    beats_after_the_failure = threading.Event()

    def write(path: str, doc: Any, **kwargs: Any) -> None:
        if path == status:
            if len(writes) == 2:  # the second heartbeat meets the stale handle
                writes.append("stale")
                raise OSError(errno.ESTALE, "Stale file handle", path)
            writes.append("ok")
            if writes.count("ok") >= 5 and "stale" in writes:
                beats_after_the_failure.set()
        real_write(path, doc, **kwargs)

    monkeypatch.setattr(module, "atomic_write_json", write)
    sup = Supervisor(str(job_dir), 0)
    sup.update()  # what main() writes before it starts the heartbeat
    first = json.loads((job_dir / "status.json").read_text())["heartbeat"]
    sup.heartbeat.start()
    try:
        assert beats_after_the_failure.wait(WAIT_S), "the heartbeat stopped after %s" % writes
    finally:
        sup.heartbeat.stop(wait_s=WAIT_S)
    assert writes[:4] == ["ok", "ok", "stale", "ok"]
    assert json.loads((job_dir / "status.json").read_text())["heartbeat"] > first
    said = [line for line in (job_dir / "logs" / "node0.log").read_text().splitlines() if "heartbeat" in line]
    assert said == ["[orch] heartbeat failed: OSError: [Errno %d] Stale file handle: %r; tried again every 0.01 s"
                    % (errno.ESTALE, status), "[orch] heartbeat works again (after 1 failed run)"]


def test_the_heartbeat_ends_with_the_terminal_state(tmp_path: Path) -> None:
    job_dir = job_folder(tmp_path)
    sup = Supervisor(str(job_dir), 0)
    sup.update()
    sup.heartbeat.start()
    sup.finish("succeeded", 0, None)  # writes the terminal state, then stops the duty
    sup.heartbeat.thread.join(WAIT_S)
    assert not sup.heartbeat.thread.is_alive()
    assert json.loads((job_dir / "status.json").read_text())["state"] == "succeeded"

"""A finished job's whole log is kept on the laptop: ``orch logs JOB`` prints it again with
the host's copy gone (no network), and a resumed job's log is read from the host again."""

from __future__ import annotations

import json
import os
import shutil
from unittest.mock import patch

from orchestrator.jobs import logcache
from tests.support.orch import Orch, write_job


def test_an_ended_jobs_log_is_printed_again_without_the_host(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "kept", host, ["python", "-c", "print('line one'); print('line two')"])
    done = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)
    assert done["state"] == "succeeded"
    job = done["job_id"]
    first = orch("logs", job).stdout
    assert "line one" in first and "line two" in first
    shutil.rmtree(orch.job_dir(job))  # the host's copy is gone: only the laptop's can answer
    if host != "local":
        orch("hosts", "rm", host)  # and the host itself: no connection is even possible
    assert orch("logs", job).stdout == first
    followed = orch("logs", job, "-f")  # following an ended job: its kept log, then its final line
    assert followed.stdout == first and f"{job} succeeded" in followed.stderr


def test_the_kept_log_answers_only_for_the_status_it_was_read_under(orch: Orch) -> None:
    spec = write_job(orch.cwd, "again", "local", ["python", "-c", "print('attempt')"])
    job = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]
    status = orch.json("status", job)
    assert status["state"] == "succeeded" and status.get("ended")
    with patch.dict(os.environ, {"ORCH_HOME": str(orch.home)}):
        assert "attempt" in (logcache.load(job, status) or "")
        assert logcache.load(job, dict(status, ended=status["ended"] + 1)) is None  # a later end (resumed)
        assert logcache.load(job, dict(status, state="running")) is None
        logcache.save(job, dict(status, state="running"), "never kept")
        assert "never kept" not in (logcache.load(job, status) or "")

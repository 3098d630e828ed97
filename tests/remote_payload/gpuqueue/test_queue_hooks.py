"""Where the GPU queue's fake inventory comes from (remote_payload/contract/testhooks.py): only
the ``test-hooks.json`` the harness writes into the root, never the job's ``env:`` nor any
process environment. The supervisor's part (``gpuqueue.take``) runs here on a job.json written by
hand, as a job file the laptop refuses (``ORCH_`` names, tests/orchestrator/spec/test_orch_names.py)
would have made it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from remote_payload.contract import testhooks
from remote_payload.gpuqueue import queue as gpuqueue
from tests.support.serverhooks import set_hooks

HOOK_NAMES = {"ORCH_TEST_GPUS": "8", "ORCH_TEST_GPUS_BUSY": "", "ORCH_TEST_GPU_MEMORY_GB": "80"}


TAKE = """\
import json, sys, threading
from remote_payload.gpuqueue import queue
updates = []
job = {"job_id": "j-1", "queue": {"gpus": 8}, "env": json.loads(sys.argv[3])}
out, reason = queue.take(sys.argv[2], job, 0, {"A": "b"}, threading.Event(), lambda **kw: updates.append(kw),
                         lambda line: None)
print(json.dumps([out, reason, updates]))
"""


def take(root: Path) -> tuple[dict[str, str], str | None, list[dict[str, Any]]]:
    """``gpuqueue.take`` for a job needing 8 GPUs whose ``env:`` carries the old hook names, in a
    stand-in supervisor (a process whose command line names ``supervisor`` and the job, as the
    queue requires of a live entry): (the job's environment, why it can never start, the status
    updates)."""
    job_dir = root / "jobs" / "j-1"
    job_dir.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-c", TAKE, "supervisor.py", str(job_dir), json.dumps(HOOK_NAMES), "j-1"],
                          capture_output=True, text=True, timeout=60, check=True)
    out, reason, updates = json.loads(done.stdout)
    return out, reason, updates


@pytest.fixture
def no_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server without nvidia-smi, whose own environment holds the old hook names too."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for name, value in HOOK_NAMES.items():
        monkeypatch.setenv(name, value)


def test_the_queue_takes_no_gpu_count_from_a_jobs_environment(tmp_path: Path, no_nvidia_smi: None) -> None:
    root = tmp_path / "root"
    out, reason, updates = take(root)
    assert (out, reason, updates) == ({"A": "b"}, None, [])  # no GPU here: it starts at once, never queues
    assert not (root / "queue").exists()
    assert gpuqueue.view(str(root))["gpus"] == []


def test_the_harness_file_in_the_root_is_the_one_way_to_fake_gpus(tmp_path: Path, no_nvidia_smi: None) -> None:
    root = tmp_path / "root"
    set_hooks(root, gpus=8)
    out, reason, updates = take(root)
    assert reason is None and out["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7" and out["A"] == "b"
    assert updates[-1]["state"] == "setting_up"
    assert json.loads((root / "queue" / "gpus.json").read_text())["source"] == "test hooks: 8 GPU(s), busy []"


@pytest.mark.parametrize("text", ['{"gpus": "8"}', '{"gpus": true}', '{"gpus": 65}', '{"gpus": -1}', "[8]", "{",
                                  '{"gpus": 1e999}'])
def test_a_malformed_harness_file_fakes_nothing(tmp_path: Path, text: str) -> None:
    Path(testhooks.path(str(tmp_path))).write_text(text)
    assert testhooks.fake_gpus(str(tmp_path)) is None
    assert testhooks.step_delay_s(str(tmp_path)) == 0.0 and testhooks.clock_shift_s(str(tmp_path)) == 0.0

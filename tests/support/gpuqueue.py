"""Helpers for the GPU queue's tests (remote_payload/gpuqueue/queue.py).

CI has no GPU: each host's root gets a fake GPU inventory from the harness (``gpus`` and
``gpus_busy`` in its ``test-hooks.json``: tests/support/serverhooks.py,
remote_payload/gpuqueue/inventory.py), on the ``local`` host and through sshd alike; a job file
cannot set it. Each job runs ``hold.py``: it records the GPUs it got
and when it ran in a gate folder, then holds them until the test touches ``<name>.release``
— so tests wait on conditions, never on timings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.orch import Orch, write_job
from tests.support.poll import wait_until
from tests.support.serverhooks import set_host_hooks

HOLD = """\
import json, os, pathlib, sys, time
name, gate = sys.argv[1], pathlib.Path(sys.argv[2])
start = time.time()
gate.mkdir(parents=True, exist_ok=True)
(gate / (name + ".started")).write_text(os.environ.get("CUDA_VISIBLE_DEVICES", "-"))
print("holding", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
deadline, least = time.time() + 300, start + (float(sys.argv[3]) if len(sys.argv) > 3 else 0)
while (not (gate / (name + ".release")).exists() or time.time() < least) and time.time() < deadline:
    time.sleep(0.05)
ran = {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "order": os.environ.get("CUDA_DEVICE_ORDER"),
       "start": start, "end": time.time()}
(gate / (name + ".ran")).write_text(json.dumps(ran))
"""


@dataclass
class Gate:
    """The folder where ``hold.py`` jobs say they started and wait to be released."""

    path: Path
    jobs: dict[str, str] = field(default_factory=dict)  # name -> job id

    def started(self, name: str) -> str | None:
        """The CUDA_VISIBLE_DEVICES the job got, once it runs."""
        f = self.path / f"{name}.started"
        return f.read_text() if f.exists() else None

    def wait_started(self, name: str, timeout: float = 120) -> str:
        return wait_until(lambda: self.started(name), what=f"{name} to start", timeout=timeout)

    def release(self, name: str) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / f"{name}.release").touch()

    def ran(self, name: str) -> dict[str, Any]:
        return json.loads((self.path / f"{name}.ran").read_text())


def gpu_job(orch: Orch, gate: Gate, host: str, name: str, gpus: int = 2, busy: str = "", launch: str = "",
            env: dict[str, str] | None = None, hold_s: float = 0, extra: str = "") -> Path:
    """A ``hold.py`` job file on a host whose fake inventory has ``gpus`` GPUs (``busy``: those
    indices busy with another process); ``launch``: more ``launch:`` lines (indented); ``env``:
    the job's ``env:``; ``hold_s``: it runs at least that long even when released already;
    ``extra``: more top-level lines."""
    folder = orch.cwd / name
    folder.mkdir()
    set_host_hooks(orch, host, gpus=gpus, gpus_busy=[int(i) for i in busy.split(",") if i.strip()])
    spec = write_job(folder, name, host, ["python", "hold.py", name, str(gate.path), str(hold_s)],
                     f"{launch}env: {json.dumps(env or {})}\n{extra}")
    (folder / "ws" / "hold.py").write_text(HOLD)
    return spec


def submit(orch: Orch, gate: Gate, host: str, name: str, **kw: Any) -> str:
    job = orch.json("submit", str(gpu_job(orch, gate, host, name, **kw)))["job_id"]
    gate.jobs[name] = job
    return job


def queued_at(orch: Orch, job: str, place: int) -> dict[str, Any]:
    """Wait until ``job`` is queued at ``place``; its status."""
    return wait_until(lambda: (lambda s: s if s["state"] == "queued" and s.get("queue_position") == place else None)(
                        orch.json("status", job)), what=f"{job} queued #{place}", timeout=120)

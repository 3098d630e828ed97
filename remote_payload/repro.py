"""What is recorded about a job, for ``orch show`` and ``orch rerun`` (standard library only).

``repro/`` in a job folder: ``spec.yaml`` (as written), ``spec.resolved.json``, ``git.json``
and ``git.diff`` from the laptop at submit; ``environment.json`` (python, torch, CUDA, GPUs)
and ``pip-freeze.txt`` written by the supervisor on the node.
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any, Dict, List, Optional

from remote_payload.common import atomic_write_json, read_json

PROBE = (
    "import json, platform, sys\n"
    "out = {'python': sys.version.split()[0], 'executable': sys.executable, 'platform': platform.platform()}\n"
    "try:\n"
    "    import torch\n"
    "    out.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())\n"
    "except Exception as exc:\n"
    "    out['torch'] = 'unavailable: %s' % exc\n"
    "print(json.dumps(out))\n"
)


def _run(argv: List[str], timeout: float = 60) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def record_environment(job_dir: str, python: str) -> None:
    """Write environment.json and pip-freeze.txt for this node (each atomically)."""
    repro = os.path.join(job_dir, "repro")
    os.makedirs(repro, exist_ok=True)
    env: Dict[str, Any] = {}
    try:
        env = json.loads(_run([python, "-c", PROBE]) or "{}")
    except ValueError:
        pass
    env["gpus"] = [line for line in _run(["nvidia-smi", "-L"], 20).splitlines() if line.startswith("GPU ")]
    freeze = _run([python, "-m", "pip", "freeze"], 120)
    tmp = os.path.join(repro, "pip-freeze.txt.tmp.%d" % os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(freeze)
    os.replace(tmp, os.path.join(repro, "pip-freeze.txt"))
    atomic_write_json(os.path.join(repro, "environment.json"), env)


FROM_LAPTOP = ("spec.yaml", "spec.resolved.json", "git.json", "git.diff")


def write_submission(folder: str, repro: Dict[str, Any]) -> None:
    """The laptop's records of a submission: the spec as written and resolved, git state."""
    os.makedirs(folder, exist_ok=True)
    texts = {"spec.yaml": repro.get("spec_text"), "git.diff": repro.get("git_diff")}
    for name, text in texts.items():
        if isinstance(text, str):
            with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
                f.write(text)
    for name, key in (("spec.resolved.json", "spec_resolved"), ("git.json", "git")):
        if repro.get(key) is not None:
            atomic_write_json(os.path.join(folder, name), repro[key])


def show(job_dir: str) -> Dict[str, Any]:
    """What was recorded about a job: spec, git state, environment, pip freeze."""
    repro = os.path.join(job_dir, "repro")

    def text(name: str, limit: int = 1 << 20) -> Optional[str]:
        try:
            with open(os.path.join(repro, name), encoding="utf-8", errors="replace") as f:
                return f.read(limit)
        except OSError:
            return None

    return {"spec_text": text("spec.yaml"), "git_diff": text("git.diff"),
            "spec_resolved": read_json(os.path.join(repro, "spec.resolved.json")),
            "git": read_json(os.path.join(repro, "git.json")),
            "environment": read_json(os.path.join(repro, "environment.json")),
            "pip_freeze": text("pip-freeze.txt")}

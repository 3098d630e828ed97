"""Server-side facts for ``orch hosts check`` / ``orch check --remote`` (agent ``preflight``).

Standard library only, Python >= 3.8. ``collect`` only reads: it never installs, writes or
starts anything that outlives it. torch is probed in a child process of this python with a
timeout, so a missing or broken torch (or a hung CUDA init) is reported, not fatal. Verdicts
are the laptop's business (``orchestrator/checks/preflight.py``); this module reports raw facts.
"""

from __future__ import annotations

import os
import platform
import pwd
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from remote_payload.helper import workspace

TORCH_PROBE = r"""
import json, sys
try:
    import torch
except Exception as exc:
    print(json.dumps({"error": "%s: %s" % (type(exc).__name__, exc)}))
    sys.exit(0)
out = {"version": torch.__version__, "cuda": torch.version.cuda, "cuda_available": False, "devices": 0, "bf16": False}
try:
    out["cuda_available"] = bool(torch.cuda.is_available())
    if out["cuda_available"]:
        out["devices"] = torch.cuda.device_count()
        out["bf16"] = bool(torch.cuda.is_bf16_supported())
except Exception as exc:
    out["cuda_error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
"""

GPU_QUERY = "index,name,memory.total,memory.used,driver_version"


def _run(argv: List[str], timeout: float) -> Optional[str]:
    """stdout of ``argv``, or None when it is missing, fails or times out."""
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.decode("utf-8", "replace") if proc.returncode == 0 else None


def torch_facts(timeout: float) -> Dict[str, Any]:
    import json

    try:
        proc = subprocess.run([sys.executable, "-c", TORCH_PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": "importing torch took over %.0f s" % timeout}
    lines = proc.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        value = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        return {"error": "the torch probe failed (exit %d) %s" % (proc.returncode, " ".join(tail))}
    return value if isinstance(value, dict) else {"error": "unreadable torch probe"}


def gpu_facts() -> Dict[str, Any]:
    """GPUs from nvidia-smi (memory in MiB); ``processes``: compute processes running now."""
    out = _run(["nvidia-smi", "--query-gpu=" + GPU_QUERY, "--format=csv,noheader,nounits"], 30)
    if out is None:
        return {"nvidia_smi": shutil.which("nvidia-smi") is not None, "gpus": [], "driver": None, "processes": 0}
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        gpus.append({"index": parts[0], "name": parts[1], "memory_total_mb": _num(parts[2]),
                     "memory_used_mb": _num(parts[3]), "driver": parts[4]})
    apps = _run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], 30) or ""
    return {"nvidia_smi": True, "gpus": gpus, "driver": gpus[0]["driver"] if gpus else None,
            "processes": len([a for a in apps.splitlines() if a.strip()])}


def _num(text: str) -> Optional[float]:
    try:
        return float(text)
    except ValueError:
        return None


def existing(path: str) -> str:
    """``path`` or its nearest existing ancestor (the root may not exist yet)."""
    path = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def disk_facts(path: str) -> Dict[str, Any]:
    where = existing(path)
    st = os.statvfs(where)
    return {"path": path, "measured_at": where, "device": os.stat(where).st_dev,
            "free_bytes": st.f_bavail * st.f_frsize, "total_bytes": st.f_blocks * st.f_frsize,
            "free_inodes": st.f_favail, "total_inodes": st.f_files}


def collect(root: str, timeout: float = 60.0) -> Dict[str, Any]:
    """Facts about this host; ``timeout``: how long the torch probe may take."""
    started = time.time()
    root_disk, system_disk = disk_facts(root), disk_facts("/")
    facts: Dict[str, Any] = {
        "hostname": platform.node(),
        "os": "%s %s" % (platform.system(), platform.release()),
        "python": sys.executable,
        "python_version": "%d.%d.%d" % sys.version_info[:3],
        "login_shell": os.environ.get("SHELL", ""),
        "user": pwd.getpwuid(os.getuid()).pw_name,
        "root": os.path.abspath(os.path.expanduser(root)),
        "disks": {"root": root_disk, "system": system_disk},
        "root_on_system_disk": root_disk["device"] == system_disk["device"],
        "tools": {name: shutil.which(name) for name in ("rsync", "tmux", "nohup", "setsid", "nvidia-smi")},
        "gpu": gpu_facts(),
        "torch": torch_facts(timeout),
        "workspaces": workspace.list_workspaces(os.path.abspath(os.path.expanduser(root))),
    }
    facts["time"] = time.time()  # last: the laptop compares it with when the reply arrived
    facts["collect_s"] = facts["time"] - started
    return facts

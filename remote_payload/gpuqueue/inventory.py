"""A host's GPUs as the GPU queue sees them (standard library only, Python >= 3.8).

``inventory`` lists each GPU's nvidia-smi index, uuid, memory total and in use (MiB) and how
many compute processes nvidia-smi lists on it (``apps``). nvidia-smi's output is untrusted
text: at most ``MAX_OUTPUT`` bytes and ``MAX_GPUS`` GPUs are read, odd fields read as unknown
(None), a run is bounded by ``SMI_TIMEOUT_S``. ``busy`` says whether a GPU no orch job holds is
in use by someone else.

Test hook (CI has no GPU): when the test harness wrote ``gpus`` into the root's
``test-hooks.json`` (``contract/testhooks.py``: never a job's ``env:``, never any environment),
the inventory is that many idle GPUs of ``gpu_memory_gb`` (default 80) each instead of
nvidia-smi's, those in ``gpus_busy`` busy with a process that is not orch's.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any, Dict, List, Mapping, Optional

from remote_payload.contract.jobfolder import atomic_write_json, read_json
from remote_payload.jobdir.processes import boot_id

REUSE_S = 1.0        # an inventory younger than this is reused, not asked of nvidia-smi again
SMI_TIMEOUT_S = 10.0
BUSY_MIB = 1024      # memory in use on a GPU no orch job holds above which it counts as busy
MAX_GPUS = 64
MAX_OUTPUT = 64 << 10
Gpu = Dict[str, Any]  # {"index", "uuid", "total_mib", "used_mib", "apps"}


def _int(text: str) -> Optional[int]:
    try:
        value = int(float(text.strip()))
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None
    return value if 0 <= value < 1 << 40 else None


def _smi(args: List[str]) -> Optional[List[List[str]]]:
    """nvidia-smi's CSV rows (untrusted text, bounded), or None when it cannot answer."""
    try:
        out = subprocess.run(["nvidia-smi"] + args + ["--format=csv,noheader,nounits"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, timeout=SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    text = out.stdout[:MAX_OUTPUT].decode("utf-8", "replace")
    return [[f.strip() for f in line.split(",")] for line in text.splitlines()[:4 * MAX_GPUS] if line.strip()]


def _from_smi() -> List[Gpu]:
    rows = _smi(["--query-gpu=index,uuid,memory.total,memory.used"]) or []
    if not rows:
        return []
    apps: Dict[str, int] = {}
    for row in _smi(["--query-compute-apps=gpu_uuid,pid"]) or []:
        apps[row[0]] = apps.get(row[0], 0) + 1
    gpus = []
    for row in rows[:MAX_GPUS]:
        index = _int(row[0]) if len(row) == 4 else None
        if index is not None and index < 1024:
            uuid = "".join(c for c in row[1] if c.isalnum() or c == "-")[:64]
            gpus.append({"index": index, "uuid": uuid, "total_mib": _int(row[2]), "used_mib": _int(row[3]),
                         "apps": apps.get(row[1], 0)})
    return gpus


def _fake(fake: Mapping[str, Any]) -> List[Gpu]:
    """The test hook's inventory (``testhooks.fake_gpus``'s answer; module docstring)."""
    total, taken = fake["memory_gb"] * 1024, set(fake["busy"])
    return [{"index": i, "uuid": "GPU-test-%d" % i, "total_mib": total, "used_mib": 8192 if i in taken else 0,
             "apps": 1 if i in taken else 0} for i in range(min(fake["gpus"], MAX_GPUS))]


def inventory(path: str, fake: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """``{"gpus", "source", "seen"}``: the test hook's GPUs when ``fake`` is given (read by the
    caller from the root with ``testhooks.fake_gpus``), else nvidia-smi's (only the indices the
    server's own ``CUDA_VISIBLE_DEVICES`` names, when it names indices). Reuses the record at
    ``path`` (``gpus.json``, written here) when it is younger than ``REUSE_S`` and from the
    same source; when nvidia-smi finds nothing now but found GPUs before in this boot (a
    hiccup), the last record stands."""
    source = "test hooks: %d GPU(s), busy %s" % (fake["gpus"], fake["busy"]) if fake is not None else "nvidia-smi"
    cached = read_json(path)
    cached = cached if recorded(cached) and cached["source"] == source else None
    if cached is not None and 0 <= time.time() - cached["seen"] < REUSE_S:
        return cached
    gpus = _fake(fake) if fake is not None else _from_smi()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if source == "nvidia-smi" and visible is not None and all(_int(v) is not None for v in visible.split(",")):
        gpus = [g for g in gpus if g["index"] in {_int(v) for v in visible.split(",")}]
    if not gpus and cached is not None and cached["gpus"] and cached.get("boot_id") == boot_id():
        return cached  # not across a restart: a box may come back without its GPUs (AutoDL's no-GPU mode)
    record = {"gpus": gpus, "source": source, "seen": time.time(), "boot_id": boot_id()}
    if gpus or cached is not None:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            atomic_write_json(path, record)
        except OSError:
            pass
    return record


def recorded(record: Any) -> bool:
    """True when ``record`` (a ``gpus.json`` read back: untrusted) has the shape ``inventory`` writes."""
    if not isinstance(record, dict) or not isinstance(record.get("source"), str) \
            or not isinstance(record.get("seen"), (int, float)) or not isinstance(record.get("gpus"), list):
        return False
    return all(isinstance(g, dict) and type(g.get("index")) is int and isinstance(g.get("uuid"), str)
               and all(g.get(k) is None or type(g.get(k)) is int for k in ("total_mib", "used_mib", "apps"))
               for g in record["gpus"][:MAX_GPUS]) and len(record["gpus"]) <= MAX_GPUS


def busy(gpu: Gpu) -> bool:
    """In use by processes orch does not account for (asked only of GPUs no orch job holds)."""
    return bool(gpu.get("apps")) or (gpu.get("used_mib") or 0) > BUSY_MIB

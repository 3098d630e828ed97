"""Preflight verdicts: the facts ``remote_payload/helper/hostfacts.py`` reports, judged on the laptop.

``judge`` is pure (facts + what a job needs → rows); ``preflight`` makes the one agent call;
``preflight_hosts`` runs it on several hosts and fails on their blockers.
A ``FAIL`` row is a blocker: the job would not run, or would fill the disk. ``warn`` rows are
worth reading but do not stop anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from orchestrator.access.connect import open_transport
from orchestrator.checks import slurm as slurmcheck
from orchestrator.checks.verdict import FAIL, OK, WARN, Row, blockers
from orchestrator.errors import RemoteError
from orchestrator.helper.remote import Remote
from orchestrator.hosts.inventory import Host, Inventory
from orchestrator.spec.model import JobSpec
from orchestrator.termtext import clean, size_text
from orchestrator.transport.base import never

GB = 1e9
MIN_FREE_GB = 5.0          # under this on the root or on `/`: a blocker
LOW_FREE_GB = 20.0         # under this: a warning
MIN_FREE_INODES = 10_000
SMALL_SYSTEM_DISK_GB = 50.0
FULL_PERCENT = 90.0        # the root's disk used over this: a warning naming orch gc
MAX_SKEW_S = 5.0
MIN_PYTHON = (3, 8)


@dataclass(frozen=True)
class Needs:
    """What a job asks of a host. The defaults (no job) block on nothing job-specific."""

    gpu: bool = False               # precision fp16/bf16
    bf16: bool = False
    nproc: int | None = None        # an explicit nproc_per_node; None for auto
    torch: bool = False             # the built-in trainer, or a command with no setup step
    job: str = ""
    cpu_rows: tuple[Row, ...] = ()  # shown on a host with no GPU: what the command leaves to its framework
    spec: JobSpec | None = field(default=None, compare=False)  # the job: can a Slurm cluster ever run it?

    @classmethod
    def of(cls, spec: JobSpec, cpu_rows: tuple[Row, ...] = ()) -> "Needs":
        """``cpu_rows``: ``gpudefaults.rows`` of the job's command (it reads the workspace)."""
        precision = spec.train.precision if spec.train is not None else "auto"
        nproc = spec.launch.nproc_per_node if isinstance(spec.launch.nproc_per_node, int) else None
        return cls(gpu=precision in ("fp16", "bf16"), bf16=precision == "bf16", nproc=nproc,
                   torch=spec.train is not None or not spec.setup, job=spec.name, cpu_rows=cpu_rows, spec=spec)


def _gb(n: Any) -> float:
    return float(n) / GB if isinstance(n, (int, float)) else 0.0


def _disk_rows(facts: dict[str, Any]) -> list[Row]:
    disks = facts.get("disks") or {}
    rows = []
    for key, label in (("root", f"disk at root {facts.get('root', '')}"), ("system", "disk at /")):
        d = disks.get(key) or {}
        free, total = _gb(d.get("free_bytes")), _gb(d.get("total_bytes"))
        inodes = d.get("free_inodes") if isinstance(d.get("free_inodes"), int) else 0
        value = f"{free:.1f} GB free of {total:.1f} GB, {inodes:,} inodes free"
        if free < MIN_FREE_GB:
            rows.append(Row(label, value, FAIL, f"under {MIN_FREE_GB:.0f} GB free: checkpoints will not fit"))
        elif 0 < inodes < MIN_FREE_INODES:
            rows.append(Row(label, value, FAIL, "almost no inodes left: new files will fail"))
        elif free < LOW_FREE_GB:
            rows.append(Row(label, value, WARN, "little space left"))
        else:
            rows.append(Row(label, value, OK))
    system_total = _gb((disks.get("system") or {}).get("total_bytes"))
    if facts.get("root_on_system_disk") and 0 < system_total < SMALL_SYSTEM_DISK_GB:
        rows.append(Row("root placement", f"root is on / ({system_total:.0f} GB)", WARN,
                        "the small system disk: put root on the data disk (--root /root/autodl-tmp/orch, "
                        "or --preset autodl)"))
    return rows


def _gpu_rows(facts: dict[str, Any], needs: Needs) -> list[Row]:
    gpu = facts.get("gpu") or {}
    gpus = [g for g in gpu.get("gpus") or [] if isinstance(g, dict)]
    torch = facts.get("torch") or {}
    rows = []
    if not gpus:
        note = "no GPU: CPU only (gloo)" if gpu.get("nvidia_smi") is False else "nvidia-smi lists no GPU"
        if needs.gpu:
            rows.append(Row("GPUs", "none", FAIL, f"{needs.job} asks for fp16/bf16, which needs a GPU"))
        elif needs.nproc and needs.nproc > 1:
            rows.append(Row("GPUs", "none", WARN, f"{note}; {needs.nproc} CPU processes"))
        else:
            rows.append(Row("GPUs", "none", WARN, note))
        rows += needs.cpu_rows
    else:
        for g in gpus:
            total, used = g.get("memory_total_mb") or 0, g.get("memory_used_mb") or 0
            value = f"{clean(str(g.get('index')))}: {clean(str(g.get('name')))}, {total / 1024:.0f} GiB, {used / 1024:.1f} GiB in use"
            busy = total and used / total > 0.1
            rows.append(Row("GPU", value, WARN if busy else OK, "memory in use by other processes" if busy else ""))
        if needs.nproc and needs.nproc > len(gpus):
            rows.append(Row("GPU count", str(len(gpus)), FAIL, f"nproc_per_node {needs.nproc} > {len(gpus)} GPUs"))
        if gpu.get("processes"):
            rows.append(Row("GPU processes", str(gpu["processes"]), WARN, "other compute processes are running"))
        rows.append(Row("driver", clean(str(gpu.get("driver") or "?")), OK))
        if torch.get("version") and not torch.get("cuda_available"):
            rows.append(Row("CUDA in torch", "not available", FAIL if needs.gpu else WARN,
                            clean(str(torch.get("cuda_error") or "torch is a CPU build or the driver is too old"))))
        elif needs.bf16 and torch.get("cuda_available") and not torch.get("bf16"):
            rows.append(Row("bf16", "not supported", FAIL, "this GPU has no bf16: use fp16 or auto"))
    return rows


def judge(facts: dict[str, Any], skew_s: float, needs: Needs, cluster: list[Row] | None = None) -> list[Row]:
    """One row per check, in a fixed order. Never raises on odd or missing facts. ``cluster``:
    a Slurm login node's rows (``slurmcheck.preflight_rows``), in place of its own GPUs'."""
    rows = [Row("login shell", clean(str(facts.get("login_shell") or "bash -l")) + f" as {clean(str(facts.get('user')))}", OK)]
    version = str(facts.get("python_version") or "0")
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    rows.append(Row("python", f"{clean(version)} at {clean(str(facts.get('python')))}",
                    OK if parts >= MIN_PYTHON else FAIL, "" if parts >= MIN_PYTHON else "orch needs python >= 3.8"))
    torch = facts.get("torch") or {}
    if torch.get("version"):
        cuda = torch.get("cuda") or "none (CPU build)"
        rows.append(Row("torch", f"{clean(str(torch['version']))}, CUDA {clean(str(cuda))}, "
                                 f"cuda.is_available() {bool(torch.get('cuda_available'))}", OK))
    else:
        note = clean(str(torch.get("error") or "not importable"))[:100]
        hint = f"{needs.job} needs it" if needs.torch else "install it in the job's setup:"
        rows.append(Row("torch", "missing", FAIL if needs.torch else WARN, f"{note}; {hint}"))
    rows += _gpu_rows(facts, needs) if cluster is None else cluster
    rows += _disk_rows(facts)
    tools = facts.get("tools") or {}
    for name in ("rsync", "tmux"):
        rows.append(Row(name, clean(str(tools.get(name))) if tools.get(name) else "missing",
                        OK if tools.get(name) else WARN, "" if tools.get(name) else "not needed by orch; handy by hand"))
    rows += _workspace_rows(facts)
    rows += _job_rows(facts)
    rows += usage_rows(facts.get("usage"))
    skew_ok = abs(skew_s) <= MAX_SKEW_S
    rows.append(Row("clock skew", f"{skew_s:+.1f} s", OK if skew_ok else WARN,
                    "" if skew_ok else "orch corrects its own times; the job's log lines carry the server's"))
    return rows


def _workspace_rows(facts: dict[str, Any]) -> list[Row]:
    """One row per synced workspace on the host (``<folder>-<8 hex>``: one per checkout)."""
    spaces = facts.get("workspaces")
    if not isinstance(spaces, list) or not spaces:
        return [Row("workspaces", "none yet", OK, "orch submit syncs one per checkout")]
    rows = []
    for space in spaces[:20]:
        if not isinstance(space, dict):
            continue
        try:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(space.get("synced") or 0)))
            size = f"{int(space.get('files') or 0)} files, {_gb(space.get('bytes')) * 1000:.1f} MB"
        except (TypeError, ValueError, OverflowError):
            continue
        rows.append(Row("workspace", f"{clean(str(space.get('name')))[:60]} ({size})", OK,
                        f"from {clean(str(space.get('laptop')))[:40]}:{clean(str(space.get('path')))[:120]}, "
                        f"synced {when}"))
    return rows


def _job_rows(facts: dict[str, Any]) -> list[Row]:
    """One row per unfinished job on the host (the server's probe of each: state, its
    supervisor's process state and heartbeat age); ``warn`` with the reason for one whose
    supervisor is not answering (remote_payload/jobdir/answering.py). None when the server
    does not say (an older payload)."""
    jobs = facts.get("jobs")
    if not isinstance(jobs, list):
        return []
    if not jobs:
        return [Row("jobs", "none running", OK)]
    rows = []
    for job in jobs[:50]:
        if not isinstance(job, dict):
            continue
        silent = isinstance(job.get("not_answering_s"), (int, float)) and not isinstance(job["not_answering_s"], bool)
        age = job.get("heartbeat_age_s")
        seen = f", last heartbeat {int(age)} s ago" if isinstance(age, (int, float)) and not isinstance(age, bool) else ""
        process = f"supervisor pid {clean(str(job.get('supervisor_pid')))}: {clean(str(job['supervisor_process']))}" \
            if isinstance(job.get("supervisor_process"), str) else ""
        note = clean(str(job.get("reason") or ""))[:300] if silent or not process else process + seen
        rows.append(Row("job", f"{clean(str(job.get('job_id')))[:80]} {clean(str(job.get('state')))[:20]}"
                        + (" (not answering)" if silent else ""), WARN if silent else OK, note))
    return rows


def usage_rows(usage: Any) -> list[Row]:
    """What orch keeps on the host, one row per class (``remote_payload/helper/reclaim.py``:
    ``usage``), and the data disk's use: ``warn`` over ``FULL_PERCENT``. No rows when not asked."""
    if not isinstance(usage, dict) or not isinstance(usage.get("classes"), dict):
        return []
    rows = []
    for kind, row in sorted(usage["classes"].items(), key=lambda kv: -_int(kv[1], "bytes")):
        rows.append(Row("orch's disk use", f"{clean(str(kind))[:40]}: {size_text(_int(row, 'bytes'))} "
                                           f"({_int(row, 'count')})", OK))
    disk = usage.get("disk") if isinstance(usage.get("disk"), dict) else {}
    total, used = _int(disk, "total_bytes"), _int(disk, "used_bytes")
    if total > 0:
        percent = 100.0 * used / total
        full = percent > FULL_PERCENT
        rows.append(Row("data disk use", f"{percent:.0f} % of {size_text(total)}", WARN if full else OK,
                        "over 90 %: `orch gc HOST --dry-run` lists what orch can free" if full else ""))
    return rows


def _int(row: Any, key: str) -> int:
    value = row.get(key) if isinstance(row, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def preflight(host: Host, inventory: Inventory, needs: Needs, usage: bool = False) -> list[Row]:
    """Ask ``host`` for its facts (one agent call; a Slurm host's cluster: one more) and judge
    them; ``usage``: with orch's disk use by class (``orch hosts check``)."""
    cluster = None
    with open_transport(host, inventory, never) as transport:
        facts = Remote(host, transport).call("preflight", timeout=180, usage=usage)
        arrived = time.time()
        if host.slurm:
            said = Remote(host, transport).call("hello", slurm=host.hello_slurm).get("slurm")
            cluster = slurmcheck.preflight_rows(host, said, needs.spec)
    skew = float(facts.get("time") or arrived) - arrived if isinstance(facts, dict) else 0.0
    return judge(facts if isinstance(facts, dict) else {}, skew, needs, cluster)


def preflight_hosts(hosts: list[Host], inventory: Inventory, needs: Needs,
                    show: Callable[[Host, list[Row]], None], usage: bool = False) -> None:
    """Preflight each host in turn, handing its rows to ``show`` as they come;
    ``RemoteError`` (exit 4) naming every blocker once all were checked."""
    failed: list[str] = []
    for host in hosts:
        rows = preflight(host, inventory, needs, usage)
        show(host, rows)
        failed += [f"{host.name}: {r.check}: {r.note or r.value}" for r in blockers(rows)]
    if failed:
        raise RemoteError(f"preflight found {len(failed)} blocker(s):\n  " + "\n  ".join(failed))

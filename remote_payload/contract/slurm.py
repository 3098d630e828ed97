"""The pure half of the Slurm rules, shared by the laptop's plan and the login node's helper
(standard library only, Python >= 3.8; docs/slurm.md). Contracts:

- Values that reach a batch script or an argv are validated first (``ValueError``, one
  line): nothing can add a script line, an option or a ``%`` filename pattern
  (``Resources``, ``batch_script``, ``srun_argv``).
- Slurm's output is untrusted: text taken from it is one bounded printable line (``clean``);
  junk never crashes a parser (``parse_fields``, ``gres_gpus``; ``orch_state`` gives orch's
  ``unknown``).
- ``orch_state`` is the one table from Slurm's job states and pending reasons to orch's.
- ``RDZV`` is the placeholder a plan's torchrun argv carries for the rendezvous endpoint,
  filled in inside the allocation (the first node's name).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from remote_payload.contract.protocol import CANCELLED, FAILED, LOST, PENDING, RUNNING, SUCCEEDED, UNKNOWN

MAX_OUT = 256 * 1024  # bytes of a Slurm client's output that are read at all
_NAME_CHARS = r"[A-Za-z0-9._+-]{1,128}"  # job, partition, account and QoS names
NAME_PATTERN = "^%s$" % _NAME_CHARS  # the same rule as a pydantic pattern (job.yaml, host entries)
NAME = re.compile(_NAME_CHARS + r"\Z")
RDZV = "@rdzv@"  # in a plan's argv: the rendezvous host, filled in inside the allocation
SAFE_PATH = re.compile(r"/[A-Za-z0-9._+,=@:~/-]{0,4000}\Z")   # no space, quote, %, \, $ or newline
TIME = re.compile(r"(?:(\d{1,5})-)?(\d{1,7}(?::\d{1,2}){0,2})\Z")
MEM = re.compile(r"(\d{1,12})([KMGT]?)\Z")
SIGNALS = ("TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "KILL", "CONT", "STOP")


class SlurmError(Exception):
    """A Slurm command failed; the message is one line, quoting Slurm where it spoke."""


def clean(text: Any, limit: int = 300) -> str:
    """Untrusted text as one printable, bounded line."""
    return " ".join("".join(c if c.isprintable() else " " for c in str(text)[:limit * 4]).split())[:limit]


def time_seconds(text: str) -> Optional[int]:
    """A Slurm time (``M``, ``M:S``, ``H:M:S``, ``D-H[:M[:S]]``) in seconds; None for no
    limit (infinite, UNLIMITED, 0); ValueError for anything else."""
    m = TIME.match(text)
    if text.lower() in ("infinite", "unlimited"):
        return None
    if not m:
        raise ValueError("bad Slurm time %r (minutes, M:S, H:M:S or D-H:M:S)" % clean(text, 40))
    nums = [int(x) for x in m.group(2).split(":")]
    units = (3600, 60, 1) if m.group(1) is not None else {1: (60,), 2: (60, 1), 3: (3600, 60, 1)}[len(nums)]
    return int(m.group(1) or 0) * 86400 + sum(n * u for n, u in zip(nums, units)) or None


def mem_mb(text: str) -> int:
    """``--mem`` text (MB without a suffix) in MB."""
    m = MEM.match(text)
    if not m:
        raise ValueError("bad memory %r (a number with K, M, G or T)" % clean(text, 40))
    return int(int(m.group(1)) * {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 ** 2}[m.group(2)])


@dataclass(frozen=True)
class Resources:
    """What a job asks Slurm for, checked on construction (ValueError). ``gpus_per_node`` 0:
    no ``--gres``; a None: the cluster's default; ``signal_before_s`` 0: no warning signal."""
    nodes: int = 1
    gpus_per_node: int = 0
    cpus_per_task: Optional[int] = None
    mem: Optional[str] = None
    time: Optional[str] = None
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    requeue: bool = False
    signal_before_s: int = 120
    job_name: str = "orch"

    def __post_init__(self) -> None:
        for name, lo, hi in (("nodes", 1, 10 ** 5), ("gpus_per_node", 0, 1024), ("cpus_per_task", 1, 10 ** 5),
                             ("signal_before_s", 0, 65535)):
            v = getattr(self, name)
            if not (name == "cpus_per_task" and v is None) and (type(v) is not int or not lo <= v <= hi):
                raise ValueError("%s must be a whole number from %d to %d, not %r" % (name, lo, hi, v))
        for name in ("partition", "account", "qos", "job_name"):
            v = getattr(self, name)
            if (v is not None or name == "job_name") and not (isinstance(v, str) and NAME.match(v)):
                raise ValueError("%s %r: use letters, digits and . _ + - only" % (name, clean(v, 60)))
        if not isinstance(self.requeue, bool):
            raise ValueError("requeue must be true or false")
        if self.mem is not None:
            mem_mb(self.mem if isinstance(self.mem, str) else "?")
        limit = None if self.time is None else time_seconds(self.time if isinstance(self.time, str) else "?")
        if limit is not None and self.signal_before_s >= limit:
            raise ValueError("signal_before_s (%d) must be shorter than the time limit %s" % (self.signal_before_s,
                                                                                             self.time))


def _command(argv: List[str]) -> None:
    if not isinstance(argv, (list, tuple)) or not argv or not all(isinstance(a, str) and "\0" not in a for a in argv) \
            or argv[0].startswith("-"):
        raise ValueError("a command must be a list of strings, the first not an option")


def checked_path(job_dir: str) -> str:
    """``job_dir`` if it is safe in a batch script and an argv (ValueError otherwise)."""
    if not isinstance(job_dir, str) or not SAFE_PATH.match(job_dir):
        raise ValueError("job folder %r: an absolute path of letters, digits and ._+,=@:~/- only" % clean(job_dir, 80))
    return job_dir.rstrip("/") or "/"


def batch_script(res: Resources, job_dir: str, argv: List[str]) -> str:
    """The batch script: ``#SBATCH`` lines for ``res`` (one task per node; Slurm's own output
    appended to ``<job_dir>/logs/slurm-%j.out``; run in ``job_dir``), then ``exec argv``,
    shell-quoted: the batch shell becomes that process, so the time-limit warning
    (``--signal=B:USR1``, ``signal_before_s`` before the limit) reaches it."""
    job_dir = checked_path(job_dir)
    _command(argv)
    opts = ["job-name=" + res.job_name, "nodes=%d" % res.nodes, "ntasks-per-node=1"]
    opts += ["gres=gpu:%d" % res.gpus_per_node] * bool(res.gpus_per_node)
    opts += ["cpus-per-task=%s" % res.cpus_per_task] * bool(res.cpus_per_task)
    opts += ["%s=%s" % (k, getattr(res, k)) for k in ("mem", "time", "partition", "account", "qos") if getattr(res, k)]
    opts += ["requeue" if res.requeue else "no-requeue"] + ["signal=B:USR1@%d" % res.signal_before_s] * bool(
        res.signal_before_s)
    log = job_dir + "/logs/slurm-%j.out"
    opts += ["output=" + log, "error=" + log, "open-mode=append", "chdir=" + job_dir]
    return "\n".join(["#!/bin/bash"] + ["#SBATCH --" + o for o in opts] + ["exec " + shlex.join(argv)]) + "\n"


def srun_argv(res: Resources, job_dir: str, inner_argv: List[str]) -> List[str]:
    """srun, inside the allocation, running ``inner_argv`` once on each node; its output
    appended to ``<job_dir>/logs/node<i>.log`` (``%n``: the node's index in the job, 0 = the
    batch host). Slurm 22.05's srun no longer reads SLURM_CPUS_PER_TASK: CPUs are passed."""
    log = checked_path(job_dir) + "/logs/node%n.log"
    _command(inner_argv)
    argv = ["srun", "--nodes=%d" % res.nodes, "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    argv += ["--gres=gpu:%d" % res.gpus_per_node] * bool(res.gpus_per_node)
    argv += ["--cpus-per-task=%s" % res.cpus_per_task] * bool(res.cpus_per_task)
    return argv + ["--output=" + log, "--error=" + log, "--open-mode=append", "--export=ALL"] + list(inner_argv)


@dataclass(frozen=True)
class Info:
    """What Slurm says about a job now; "" where it said nothing (or None)."""
    job_id: str
    state: str                       # JobState: PENDING, RUNNING, ... (junk: orch_state says unknown)
    reason: str = ""
    exit_code: Optional[int] = None  # ExitCode=a:b -> a, signal b
    signal: Optional[int] = None
    nodelist: str = ""
    batch_host: str = ""
    partition: str = ""
    time_limit: str = ""
    source: str = "scontrol"         # or squeue, sacct


def parse_fields(line: str) -> Dict[str, str]:
    """``Key=value ...`` (scontrol -o). A value runs until the next token that starts with a
    key not seen yet, so values with spaces (JobName, Command, WorkDir, StdOut) or ``=`` stay
    whole; the first of a repeated key wins."""
    fields: Dict[str, str] = {}
    key = None
    for tok in line[:MAX_OUT].split():
        m = re.match(r"([A-Z][A-Za-z0-9_:/]{0,40})=", tok)
        if m and m.group(1) not in fields:
            key, fields[m.group(1)] = m.group(1), tok[m.end():]
        elif key is not None:
            fields[key] += " " + tok
    return fields


_WAIT = {
    "Resources": "the nodes it needs are busy", "Priority": "jobs with a higher priority go first",
    "Dependency": "it waits for the jobs it depends on", "BeginTime": "its start time has not come yet",
    "JobHeldUser": "held by its user: scontrol release", "JobHeldAdmin": "held by an administrator",
    "Cleaning": "its previous run is still being cleaned up", "Prolog": "its prolog is still running",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved", "NodeDown": "a node it needs is down",
    "PartitionDown": "the partition is down", "PartitionInactive": "the partition is inactive",
    "Reservation": "it waits for its reservation", "Licenses": "it waits for a license",
    "WaitingForScheduling": "not scheduled yet"}
_NEVER = {
    "PartitionNodeLimit": "asks for more nodes than partition %s has", "PartitionConfig": "asks for more than "
    "partition %s has", "PartitionTimeLimit": "asks for more time than partition %s allows",
    "DependencyNeverSatisfied": "a job it depends on failed", "BadConstraints": "its constraints match no node",
    "InvalidAccount": "the account is invalid", "InvalidQOS": "the QoS is invalid"}
_ENDS = {"TIMEOUT": "it reached its time limit", "OUT_OF_MEMORY": "it ran out of memory",
         "NODE_FAIL": "a node of the job failed", "PREEMPTED": "a higher-priority job preempted it",
         "BOOT_FAIL": "a node failed to boot", "DEADLINE": "it could not end before its deadline",
         "LAUNCH_FAILED": "Slurm could not launch it"}


def never_starts(reason: str) -> bool:
    """Whether a pending job with this Slurm reason can never start as asked."""
    code = reason.split(",")[0]
    return code in _NEVER or (code.startswith(("QOSMax", "AssocMax")) and ("PerJob" in code or "PerNode" in code))


def orch_state(info: Optional[Info], job_id: str = "") -> Tuple[str, Optional[str]]:
    """orch's (state, reason) for what Slurm says (None: it forgot the job). Pure."""
    if info is None:
        return LOST, "Slurm no longer knows job %s and it recorded no end" % (clean(job_id, 40) or "?")
    s, r = info.state, info.reason or "None"
    code = r.split(",")[0]
    if s in ("REQUEUE_HOLD", "SPECIAL_EXIT"):
        return PENDING, "waiting for Slurm: held after a requeue (scontrol release %s)" % info.job_id
    if s in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_FED", "RESV_DEL_HOLD", "POWER_UP_NODE"):
        if never_starts(r):
            why = _NEVER.get(code, "a per-job limit of its QoS or account")
            why = why % (info.partition or "?") if "%s" in why else why
            return PENDING, "waiting for Slurm: %s (%s) — it can never start as asked" % (r, why)
        if code == "None":
            return PENDING, "waiting for Slurm: %s" % ("not scheduled yet" if s == "PENDING" else s.lower())
        why = _WAIT.get(code) or ("a limit of its %s is reached" % ("QoS" if code.startswith("QOS") else "account")
                                  if code.startswith(("QOS", "Assoc")) else "")
        return PENDING, "waiting for Slurm: %s%s" % (r, " (%s)" % why if why else "")
    if s in ("RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"):
        return RUNNING, None
    if s in ("SUSPENDED", "STOPPED"):
        return RUNNING, "suspended by Slurm (%s)" % s
    if s in ("COMPLETED", "CANCELLED"):
        return (SUCCEEDED, None) if s == "COMPLETED" else (CANCELLED, "cancelled in Slurm")
    if s == "FAILED" and info.signal:
        return FAILED, "the batch script was killed by signal %d" % info.signal
    if s == "FAILED":
        return FAILED, "exit code %s" % ("unknown" if info.exit_code is None else info.exit_code)
    if s in _ENDS:
        where = {"TIMEOUT": info.time_limit, "NODE_FAIL": info.nodelist}.get(s)
        return FAILED, "%s: %s%s" % (s, _ENDS[s], " (%s)" % where if where else "")
    return UNKNOWN, "Slurm reports the state %r, which orch does not know" % clean(s, 40)


def gres_gpus(gres: str) -> int:
    """GPUs per node in a gres text: ``gpu:2``, ``gpu:a100:4(S:0-1),gpu:v100:2,mps:100``."""
    items = (re.match(r"gpu(?::[^:(),]+)?(?::no_consume)?:(\d{1,6})(?:\(|\Z)", item.strip())
             for item in re.split(r",(?![^()]*\))", gres[:4000]))
    return sum(int(m.group(1)) for m in items if m)


def fits(facts: Dict[str, Any], res: Resources) -> Optional[str]:
    """A one-line reason when ``res`` can never run on the cluster ``facts`` describes, else None."""
    parts = facts.get("partitions") or {}
    name = res.partition or next((n for n, p in parts.items() if p.get("default")), None)
    p = parts.get(name)
    if name is None or p is None:
        return "partition %s does not exist (partitions: %s)" % (name, ", ".join(sorted(parts)) or "none") if name \
            else "no partition asked for and the cluster has no default partition"
    if res.nodes > p["nodes"]:
        return "asks for %d nodes but partition %s has %d" % (res.nodes, name, p["nodes"])
    if res.gpus_per_node > p["max_gpus_per_node"]:
        return "asks for %d GPUs per node but the nodes of partition %s have at most %d" % (
            res.gpus_per_node, name, p["max_gpus_per_node"])
    mem, cpus = mem_mb(res.mem) if res.mem else 0, res.cpus_per_task or 1
    able = sum(g["nodes"] for g in p["groups"] if g["gpus"] >= res.gpus_per_node and g["cpus"] >= cpus
               and g["mem_mb"] >= mem)
    if able < res.nodes:
        return "asks for %d nodes with %d GPUs, %d CPUs and %s memory each but partition %s has %d such nodes" % (
            res.nodes, res.gpus_per_node, cpus, res.mem or "any", name, able)
    limit = time_seconds(res.time) if res.time else None
    if limit and p["max_time_s"] and limit > p["max_time_s"]:
        return "asks for time %s but partition %s allows at most %s" % (res.time, name, p["max_time"])
    return None

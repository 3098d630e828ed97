"""Slurm through its command-line clients, for the login-node helper (issue 13). Standard
library only, Python >= 3.8. Contracts:

- Commands are argv lists (never shell strings), run with a timeout (``TIMEOUT_S``), the
  program found on the PATH of this process's environment plus ``env`` (e.g. SLURM_CONF).
  A program missing, hanging, or failing in a way the caller cannot act on raises
  ``SlurmError``: one line, quoting Slurm's own words.
- Slurm's output is untrusted: at most ``MAX_OUT`` bytes are read and decoded with
  replacement; text taken from it is one bounded printable line; junk never crashes a
  parser (it gives None, an empty field or orch's ``unknown``).
- Values that reach a batch script or an argv are validated first (``ValueError``, one
  line): nothing can add a script line, an option or a ``%`` filename pattern.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from remote_payload.protocol import CANCELLED, FAILED, LOST, PENDING, RUNNING, SUCCEEDED, UNKNOWN

TIMEOUT_S = 30.0
MAX_OUT = 256 * 1024
Env = Optional[Dict[str, str]]
_NAME = re.compile(r"[A-Za-z0-9._+-]{1,128}\Z")           # job, partition, account and QoS names
_PATH = re.compile(r"/[A-Za-z0-9._+,=@:~/-]{0,4000}\Z")   # no space, quote, %, \, $ or newline
_TIME = re.compile(r"(?:(\d{1,5})-)?(\d{1,7}(?::\d{1,2}){0,2})\Z")
_MEM = re.compile(r"(\d{1,12})([KMGT]?)\Z")
_SIGNALS = ("TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "KILL", "CONT", "STOP")


class SlurmError(Exception):
    """A Slurm command failed; the message is one line, quoting Slurm where it spoke."""


def clean(text: Any, limit: int = 300) -> str:
    """Untrusted text as one printable, bounded line."""
    return " ".join("".join(c if c.isprintable() else " " for c in str(text)[:limit * 4]).split())[:limit]


def time_seconds(text: str) -> Optional[int]:
    """A Slurm time (``M``, ``M:S``, ``H:M:S``, ``D-H[:M[:S]]``) in seconds; None for no
    limit (infinite, UNLIMITED, 0); ValueError for anything else."""
    m = _TIME.match(text)
    if text.lower() in ("infinite", "unlimited"):
        return None
    if not m:
        raise ValueError("bad Slurm time %r (minutes, M:S, H:M:S or D-H:M:S)" % clean(text, 40))
    nums = [int(x) for x in m.group(2).split(":")]
    units = (3600, 60, 1) if m.group(1) is not None else {1: (60,), 2: (60, 1), 3: (3600, 60, 1)}[len(nums)]
    return int(m.group(1) or 0) * 86400 + sum(n * u for n, u in zip(nums, units)) or None


def mem_mb(text: str) -> int:
    """``--mem`` text (MB without a suffix) in MB."""
    m = _MEM.match(text)
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
            if (v is not None or name == "job_name") and not (isinstance(v, str) and _NAME.match(v)):
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


def _path(job_dir: str) -> str:
    if not isinstance(job_dir, str) or not _PATH.match(job_dir):
        raise ValueError("job folder %r: an absolute path of letters, digits and ._+,=@:~/- only" % clean(job_dir, 80))
    return job_dir.rstrip("/") or "/"


def batch_script(res: Resources, job_dir: str, argv: List[str]) -> str:
    """The batch script: ``#SBATCH`` lines for ``res`` (one task per node; Slurm's own output
    appended to ``<job_dir>/logs/slurm-%j.out``; run in ``job_dir``), then ``exec argv``,
    shell-quoted: the batch shell becomes that process, so the time-limit warning
    (``--signal=B:USR1``, ``signal_before_s`` before the limit) reaches it."""
    job_dir = _path(job_dir)
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
    log = _path(job_dir) + "/logs/node%n.log"
    _command(inner_argv)
    argv = ["srun", "--nodes=%d" % res.nodes, "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    argv += ["--gres=gpu:%d" % res.gpus_per_node] * bool(res.gpus_per_node)
    argv += ["--cpus-per-task=%s" % res.cpus_per_task] * bool(res.cpus_per_task)
    return argv + ["--output=" + log, "--error=" + log, "--open-mode=append", "--export=ALL"] + list(inner_argv)


def _run(argv: List[str], env: Env) -> Tuple[int, str, str]:
    """(returncode, stdout, stderr) of a Slurm client (at most TIMEOUT_S), both texts bounded."""
    full = dict(os.environ, **(env or {}))
    exe = shutil.which(argv[0], path=full.get("PATH", os.defpath))
    if exe is None:
        raise SlurmError("%s not found on PATH: is this a Slurm login node?" % argv[0])
    try:
        proc = subprocess.run([exe] + argv[1:], env=full, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise SlurmError("%s did not answer within %gs (is slurmctld up?)" % (argv[0], TIMEOUT_S)) from None
    except OSError as e:
        raise SlurmError("cannot run %s: %s" % (argv[0], clean(e))) from None
    out, err = (b[:MAX_OUT].decode(errors="replace") for b in (proc.stdout, proc.stderr))
    return proc.returncode, out, err


def _said(stderr: str, rc: int) -> str:
    """Slurm's complaint (its last two error lines), without ``prog: error:`` prefixes."""
    lines = [re.sub(r"^[\w.-]+: (error|fatal): ", "", ln.strip()) for ln in stderr.splitlines() if ln.strip()]
    errs = [ln for ln in lines if re.search(r"error|fail|invalid|denied|unable", ln, re.I)] or lines
    return clean("; ".join(errs[-2:]).replace("Batch job submission failed: ", "")) or "exit status %d" % rc


def _job_id(job_id: str) -> str:
    if not isinstance(job_id, str) or not re.match(r"\d{1,12}\Z", job_id):
        raise ValueError("bad Slurm job id %r" % clean(job_id, 40))
    return job_id


def submit(script_path: str, env: Env = None) -> str:
    """``sbatch --parsable`` the script: the job id; SlurmError when sbatch refuses."""
    rc, out, err = _run(["sbatch", "--parsable", _path(script_path)], env)
    job = out.strip().split(";")[0] if rc == 0 else ""
    if not re.match(r"\d{1,12}\Z", job):
        raise SlurmError("sbatch refused the job: %s" % (_said(err, rc) if rc else "it printed %r" % clean(out, 80)))
    return job


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


def _info(job_id: str, f: Dict[str, str], source: str) -> Info:
    code = re.match(r"(\d{1,9}):(\d{1,9})\Z", f.get("ExitCode", ""))
    raw = re.match(r"\d{1,9}\Z", f.get("ExitCode", ""))  # squeue: a wait status
    status = (int(code.group(1)), int(code.group(2))) if code else (int(raw.group()) >> 8 & 255,
                                                                    int(raw.group()) & 127) if raw else (None, None)
    v = {k: "" if x in ("None", "(null)") else clean(x) for k, x in f.items()}
    return Info(job_id, clean(f.get("JobState", "").split(" ")[0], 40), v.get("Reason", ""), *status,
                v.get("NodeList", ""), v.get("BatchHost", ""), v.get("Partition", ""), v.get("TimeLimit", ""), source)


_COLUMNS = {"squeue": ("JobID", "State", "Reason", "exit_code", "NodeList", "BatchHost", "Partition", "TimeLimit"),
            "sacct": ("JobID", "State", "Reason", "ExitCode", "NodeList", "Partition", "Timelimit")}
_KEYS = {"JobID": "JobId", "State": "JobState", "exit_code": "ExitCode", "Timelimit": "TimeLimit"}


def query(job_id: str, env: Env = None) -> Optional[Info]:
    """What Slurm says now: ``scontrol show job``, else ``squeue -t all``, else ``sacct`` (when
    accounting works). None when no source knows the job (ended more than MinJobAge ago
    without accounting, or never there). SlurmError when neither scontrol nor squeue answers."""
    squeue = ",".join(c + ":|" for c in _COLUMNS["squeue"])
    sources = (("scontrol", ["scontrol", "show", "job", "-o", _job_id(job_id)]),
               ("squeue", ["squeue", "-h", "-t", "all", "-j", job_id, "-O", squeue]),
               ("sacct", ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", ",".join(_COLUMNS["sacct"])]))
    errors = []
    for name, argv in sources:
        try:
            rc, out, err = _run(argv, env)
        except SlurmError:
            if name != "sacct":
                raise
            break
        if rc != 0 and name != "sacct" and "Invalid job id" not in err:
            errors.append("%s: %s" % (name, _said(err, rc)))
        for line in out.splitlines() if rc == 0 else []:
            values = line.split("|")
            fields = parse_fields(line) if name == "scontrol" else {} if len(values) < len(_COLUMNS[name]) else {
                _KEYS.get(k, k): x.strip() for k, x in zip(_COLUMNS[name], values)}
            if fields.get("JobId") == job_id:
                return _info(job_id, fields, name)
    if len(errors) == 2:
        raise SlurmError("cannot ask Slurm about job %s: %s" % (job_id, "; ".join(errors)))
    return None


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


def hostnames(nodelist: str, env: Env = None) -> List[str]:
    """``node[1-2]`` -> ``["node1", "node2"]`` (``scontrol show hostnames``)."""
    if not isinstance(nodelist, str) or not re.match(r"[A-Za-z0-9][A-Za-z0-9._,\[\]-]{0,4000}\Z", nodelist):
        raise ValueError("bad Slurm node list %r" % clean(nodelist, 80))
    rc, out, err = _run(["scontrol", "show", "hostnames", nodelist], env)
    if rc != 0:
        raise SlurmError("scontrol show hostnames %s: %s" % (nodelist, _said(err, rc)))
    return [clean(h, 255) for h in out.split()]


def _scancel(args: List[str], job_id: str, env: Env) -> bool:
    rc, out, err = _run(["scancel"] + args + [_job_id(job_id)], env)
    if re.search(r"already completing or completed|Invalid job id", err):
        return False
    if rc != 0:
        raise SlurmError("scancel %s: %s" % (job_id, _said(err, rc)))
    return True


def signal(job_id: str, sig_name: str, batch_only: bool, env: Env = None, steps_only: bool = False) -> bool:
    """Send ``sig_name`` (TERM, SIGUSR1, ...): ``batch_only``: to the batch shell alone
    (``--batch``); ``steps_only``: to the processes of every step on every node, not the batch
    shell (a plain ``scancel --signal``; signalling srun instead would kill its step at once);
    else to the batch shell, its children and every step (``--full``). False when nothing of
    the job runs (pending or ended): scancel --signal would retry a pending job for a minute
    or more."""
    sig = re.sub(r"^SIG", "", sig_name.upper()) if isinstance(sig_name, str) else ""
    if sig not in _SIGNALS:
        raise ValueError("signal %r: one of %s" % (clean(sig_name, 20), ", ".join(_SIGNALS)))
    info = query(job_id, env)
    if info is None or info.state not in ("RUNNING", "SUSPENDED"):
        return False
    who = ["--batch"] if batch_only else [] if steps_only else ["--full"]
    return _scancel(["--signal=" + sig] + who, job_id, env)


def cancel(job_id: str, env: Env = None) -> None:
    """``scancel``: SIGTERM to every process of the job, SIGKILL after KillWait. A job that has
    ended is no error (Slurm 22.05's scancel says nothing about it: ask ``query``)."""
    _scancel([], job_id, env)


def requeue(job_id: str, env: Env = None) -> None:
    """``scontrol requeue``: back to pending (a job submitted with ``requeue``)."""
    rc, out, err = _run(["scontrol", "requeue", _job_id(job_id)], env)
    if rc != 0:
        raise SlurmError("scontrol requeue %s: %s" % (job_id, _said(err, rc)))


def gres_gpus(gres: str) -> int:
    """GPUs per node in a gres text: ``gpu:2``, ``gpu:a100:4(S:0-1),gpu:v100:2,mps:100``."""
    items = (re.match(r"gpu(?::[^:(),]+)?(?::no_consume)?:(\d{1,6})(?:\(|\Z)", item.strip())
             for item in re.split(r",(?![^()]*\))", gres[:4000]))
    return sum(int(m.group(1)) for m in items if m)


def cluster_facts(env: Env = None) -> Dict[str, Any]:
    """For preflight: ``{"version", "accounting": bool, "partitions": {name: {"nodes", "state",
    "max_time" (text), "max_time_s" (None: no limit), "default": bool, "max_gpus_per_node",
    "groups": [{"nodes", "gpus", "cpus", "mem_mb"}, one per kind of node]}}}``."""
    rc, out, err = _run(["sinfo", "-h", "-o", "%P|%D|%a|%l|%G|%c|%m"], env)
    if rc != 0:
        raise SlurmError("sinfo: %s" % _said(err, rc))
    parts: Dict[str, Dict[str, Any]] = {}
    for v in (line.strip().split("|") for line in out.splitlines()[:10000]):
        if len(v) != 7 or not _NAME.match(v[0].rstrip("*")):
            continue
        nodes, cpus, mem = (int("0" + re.match(r"\d{0,9}", x).group()) for x in (v[1], v[5], v[6]))  # "2+": 2
        limit = time_seconds(v[3]) if _TIME.match(v[3]) else None
        p = parts.setdefault(v[0].rstrip("*"), {"nodes": 0, "state": clean(v[2], 20), "max_time": clean(v[3], 20),
                                                "max_time_s": limit, "default": v[0].endswith("*"), "groups": []})
        p["nodes"] += nodes
        p["groups"].append({"nodes": nodes, "gpus": gres_gpus(v[4]), "cpus": cpus, "mem_mb": mem})
        p["max_gpus_per_node"] = max(g["gpus"] for g in p["groups"])
    version = _run(["sinfo", "--version"], env)[1].split()
    try:
        accounting = _run(["sacct", "-n", "-X", "-j", "1", "-o", "JobID"], env)[0] == 0
    except SlurmError:
        accounting = False
    return {"version": clean(version[-1] if version else "", 40), "accounting": accounting, "partitions": parts}


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

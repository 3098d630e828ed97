"""Slurm through its command-line clients, for the login-node helper (issue 13). Standard
library only, Python >= 3.8. Contracts:

- Commands are argv lists (never shell strings), run with a timeout (``TIMEOUT_S``), the
  program found on the PATH of this process's environment plus ``env`` (e.g. SLURM_CONF).
  A program missing, hanging, or failing in a way the caller cannot act on raises
  ``SlurmError``: one line, quoting Slurm's own words.
- Slurm's output is untrusted: at most ``MAX_OUT`` bytes are read and decoded with
  replacement; text taken from it is one bounded printable line; junk never crashes a
  parser (it gives None, an empty field or orch's ``unknown``).
- Validation, parsing and the state table are the pure half, in
  ``remote_payload.contract.slurm`` (the laptop's plan uses them too).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Any, Dict, List, Optional, Tuple

from remote_payload.contract.slurm import (
    MAX_OUT,
    NAME,
    SIGNALS,
    TIME,
    Info,
    SlurmError,
    checked_path,
    clean,
    gres_gpus,
    parse_fields,
    time_seconds,
)

TIMEOUT_S = 30.0
Env = Optional[Dict[str, str]]


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
    rc, out, err = _run(["sbatch", "--parsable", checked_path(script_path)], env)
    job = out.strip().split(";")[0] if rc == 0 else ""
    if not re.match(r"\d{1,12}\Z", job):
        raise SlurmError("sbatch refused the job: %s" % (_said(err, rc) if rc else "it printed %r" % clean(out, 80)))
    return job


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
    if sig not in SIGNALS:
        raise ValueError("signal %r: one of %s" % (clean(sig_name, 20), ", ".join(SIGNALS)))
    info = query(job_id, env)
    if info is None or info.state not in ("RUNNING", "SUSPENDED"):
        return False
    who = ["--batch"] if batch_only else [] if steps_only else ["--full"]
    return _scancel(["--signal=" + sig] + who, job_id, env)


def cancel(job_id: str, env: Env = None) -> None:
    """``scancel``: SIGTERM to every process of the job, SIGKILL after KillWait. A job that has
    ended is no error (Slurm 22.05's scancel says nothing about it: ask ``query``)."""
    _scancel([], job_id, env)


def requeue(job_id: str, env: Env = None) -> bool:
    """``scontrol requeue``: back to pending (a job submitted with ``requeue``). True when
    scontrol said yes; False when a signal ended scontrol before it exited: asked from inside
    the job's own allocation, the requeue ends that run at once and Slurm's SIGTERM to the run's
    processes may reach scontrol first, so whether it took is not known. SlurmError when Slurm
    refused (scontrol exits non-zero with its complaint)."""
    rc, out, err = _run(["scontrol", "requeue", _job_id(job_id)], env)
    if rc < 0:
        return False
    if rc != 0:
        raise SlurmError("scontrol requeue %s: %s" % (job_id, _said(err, rc)))
    return True


def cluster_facts(env: Env = None) -> Dict[str, Any]:
    """For preflight: ``{"version", "accounting": bool, "partitions": {name: {"nodes", "state",
    "max_time" (text), "max_time_s" (None: no limit), "default": bool, "max_gpus_per_node",
    "groups": [{"nodes", "gpus", "cpus", "mem_mb"}, one per kind of node]}}}``."""
    rc, out, err = _run(["sinfo", "-h", "-o", "%P|%D|%a|%l|%G|%c|%m"], env)
    if rc != 0:
        raise SlurmError("sinfo: %s" % _said(err, rc))
    parts: Dict[str, Dict[str, Any]] = {}
    for v in (line.strip().split("|") for line in out.splitlines()[:10000]):
        if len(v) != 7 or not NAME.match(v[0].rstrip("*")):
            continue
        nodes, cpus, mem = (int("0" + re.match(r"\d{0,9}", x).group()) for x in (v[1], v[5], v[6]))  # "2+": 2
        limit = time_seconds(v[3]) if TIME.match(v[3]) else None
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



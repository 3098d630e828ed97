"""A launcher's argv made whole on its node (standard library only): what the laptop's plan
(orchestrator/plan/launchers.py) cannot know.

- ``FREE_PORT`` in the argv becomes a TCP port free on this node now (a one-node accelerate or
  deepspeed job's rendezvous; torchrun ``--standalone`` picks its own).
- deepspeed: across nodes it reads the nodes and their process counts from a hostfile (its
  ``--no_ssh`` mode starts nothing elsewhere; orch starts it on every node): the supervisor writes
  ``<job_dir>/deepspeed_hostfile`` from job.json. When the node's GPUs are named by
  ``CUDA_VISIBLE_DEVICES`` (the GPU queue's, or the job's own), deepspeed would ignore it beside
  ``--num_gpus`` and take GPUs 0..N-1; they are passed as ``--include`` instead, so the job runs
  on exactly the GPUs it was given.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

from remote_payload.contract.jobfolder import DEEPSPEED_HOSTFILE, FREE_PORT, atomic_write_text
from remote_payload.supervisor.direct import free_port


def complete(argv: List[str], job: Dict[str, Any], node: Dict[str, Any], env: Dict[str, str],
             job_dir: str) -> List[str]:
    """``argv`` ready to run on this node."""
    if FREE_PORT in argv:
        port = str(free_port())
        argv = [port if a == FREE_PORT else a for a in argv]
    if node.get("launcher") == "deepspeed":
        argv = _deepspeed(argv, job, node, env, job_dir)
    return argv


def _gpu_ids(env: Dict[str, str]) -> List[int]:
    items = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return [int(v) for v in items] if items and all(v.isdigit() for v in items) else []


def _deepspeed(argv: List[str], job: Dict[str, Any], node: Dict[str, Any], env: Dict[str, str],
               job_dir: str) -> List[str]:
    nodes = job.get("nodes") or [node]
    rank = int(node.get("node_rank", 0))
    multi = len(nodes) > 1
    ids = _gpu_ids(env)
    if multi:
        lines = []
        for i, other in enumerate(nodes):
            slots = max(ids) + 1 if i == rank and ids else int(other.get("nproc", 1))
            lines.append("node%d slots=%d\n" % (i, slots))
        path = os.path.join(job_dir, DEEPSPEED_HOSTFILE)
        atomic_write_text(path, "".join(lines))
    if not ids:
        return argv
    out = _without(argv, ("--num_gpus", "--num_nodes"))
    if multi:
        parts = ["node%d:%s" % (i, ",".join(str(g) for g in (ids if i == rank else range(int(o.get("nproc", 1))))))
                 for i, o in enumerate(nodes)]
        include = "@".join(parts)
    else:
        include = "localhost:" + ",".join(str(g) for g in ids)
    at = out.index("deepspeed.launcher.runner") + 1 if "deepspeed.launcher.runner" in out else 1
    return out[:at] + ["--include", include] + out[at:]


def _without(argv: List[str], flags: tuple) -> List[str]:
    """``argv`` less the first ``FLAG VALUE`` pair of each of ``flags`` (orch's own, ahead of the script)."""
    out = list(argv)
    for flag in flags:
        if flag in out:
            i = out.index(flag)
            del out[i:i + 2]
    return out

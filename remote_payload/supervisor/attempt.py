"""What an attempt after the first changes (standard library only): ``resume_args`` appended to
the job's argv, and the step the attempts before it reached.

Contract (docs/own-script.md, "Resume"):

- Attempt N > 1 (``orch resume``) appends job.json's ``resume_args`` to the argv, at its very end
  (the script's own arguments come last under every launcher). ``{last_checkpoint}`` in one is the
  newest ``checkpoint-N/`` folder holding a ``trainer_state.json`` under the job folder (found the
  way the metrics watcher finds it); with none, the resume arguments are left out and the log says
  the script starts over.
- ``reached_step`` is the highest ``step`` in metrics.jsonl's last 256 KiB when the attempt
  starts: status.json's ``resumed_from_step``, so status can say a script started over.
"""

from __future__ import annotations

import json
import os
from typing import Callable, List, Optional

from remote_payload.supervisor import scrape

LAST_CHECKPOINT = "{last_checkpoint}"
TAIL_BYTES = 256 << 10


def resume_argv(argv: List[str], resume_args: List[str], job_dir: str, say: Callable[[str], None]) -> List[str]:
    """``argv`` with ``resume_args`` at its end, ``{last_checkpoint}`` filled in."""
    if not resume_args:
        return list(argv)
    if any(LAST_CHECKPOINT in a for a in resume_args):
        state = scrape.find_trainer_state(job_dir)
        if state is None:
            say("resume_args need {last_checkpoint}, but there is no checkpoint-N/ folder with a trainer_state.json "
                "in the job folder: they are left out, so the script starts over")
            return list(argv)
        folder = os.path.dirname(state)
        resume_args = [a.replace(LAST_CHECKPOINT, folder) for a in resume_args]
    say("resuming: %s appended to the command" % " ".join(resume_args))
    return list(argv) + list(resume_args)


def reached_step(job_dir: str) -> Optional[int]:
    """The highest step metrics.jsonl records so far (its last ``TAIL_BYTES``), or None."""
    path = os.path.join(job_dir, "metrics.jsonl")
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read(TAIL_BYTES)
    except OSError:
        return None
    best: Optional[int] = None
    for line in data.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        step = row.get("step") if isinstance(row, dict) else None
        if isinstance(step, (int, float)) and not isinstance(step, bool) and step == step and step >= 0:
            best = int(step) if best is None else max(best, int(step))
    return best

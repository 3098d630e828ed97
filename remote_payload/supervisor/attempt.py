"""What an attempt after the first changes (standard library only): ``resume_args`` appended to
the job's argv, and the step the attempts before it reached.

Contract (docs/own-script.md, "Resume"):

- Attempt N > 1 (``orch resume``) appends job.json's ``resume_args`` to the argv, at its very end
  (the script's own arguments come last under every launcher). ``{last_checkpoint}`` in one is the
  newest complete checkpoint under the job folder in any layout ``lastcheckpoint.find`` knows
  (Hugging Face ``checkpoint-N/``, accelerate's ``step_N/``/``epoch_N/``/``checkpoint_N/``,
  torchtune's ``epoch_N/``, Lightning's ``*.ckpt``, nanoGPT's ``ckpt.pt``); with none, the resume
  arguments are left out and the script starts over: ``plan`` says so in its note and its
  ``dropped`` (status.json's ``resume_dropped``, which ``orch status`` shows as ``(started over)``).
- ``reached_step`` is the highest ``step`` in metrics.jsonl's last 256 KiB when the attempt
  starts: status.json's ``resumed_from_step``, so status can say a script started over.
"""

from __future__ import annotations

import json
import os
from typing import Callable, List, NamedTuple, Optional

from remote_payload.supervisor import lastcheckpoint

LAST_CHECKPOINT = "{last_checkpoint}"
TAIL_BYTES = 256 << 10


class Resume(NamedTuple):
    """What an attempt after the first appends (``args``, maybe none), one line saying so
    (``note``, paths shown under the job folder), and, when ``resume_args`` were left out for
    want of a checkpoint, why (``dropped``; else None)."""

    args: List[str]
    note: str
    dropped: Optional[str]


def plan(resume_args: List[str], job_dir: str) -> Resume:
    """The ``Resume`` of an attempt after the first of the job in ``job_dir`` (the folder as
    it is now: the checkpoints the attempts before left)."""
    if not resume_args:
        return Resume([], "no launch.resume_args: the command runs as on the first attempt", None)
    if not any(LAST_CHECKPOINT in a for a in resume_args):
        return Resume(list(resume_args), "resuming: %s appended to the command" % " ".join(resume_args), None)
    found = lastcheckpoint.find(job_dir)
    if found is None:
        why = ("no complete checkpoint for {last_checkpoint} in the job folder (looked for %s): resume_args left out"
               % lastcheckpoint.LOOKED_FOR)
        return Resume([], "the script starts over: " + why, why)
    args = [a.replace(LAST_CHECKPOINT, found.path) for a in resume_args]
    shown = os.path.relpath(found.path, job_dir)
    return Resume(args, "resuming from %s (the newest complete checkpoint, %s): %s appended to the command"
                  % (shown, lastcheckpoint.KINDS[found.kind], " ".join(args)), None)


def resume_argv(argv: List[str], resume_args: List[str], job_dir: str, say: Callable[[str], None],
                dropped: Optional[Callable[[str], None]] = None) -> List[str]:
    """``argv`` with ``resume_args`` at its end, ``{last_checkpoint}`` filled in; the note
    said; ``dropped`` called with the reason when they were left out."""
    if not resume_args:
        return list(argv)
    resume = plan(resume_args, job_dir)
    say(resume.note)
    if resume.dropped is not None and dropped is not None:
        dropped(resume.dropped)
    return list(argv) + resume.args


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

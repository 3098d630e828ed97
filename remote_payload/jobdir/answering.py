"""Whether a job's supervisor answers: its heartbeat's age against its job's beat, and its
process's state in ``/proc`` (Linux, standard library only, Python >= 3.8).

A supervisor rewrites status.json every ``heartbeat_s`` seconds (job.json; 2 s by default).
One whose pid lives but whose heartbeat is older than ``silent_after(heartbeat_s)`` — five
beats, never under 10 s (the age within which Slurm's probe trusts a heartbeat without asking
Slurm, ``slurm/job.py``: ``FRESH_S``) — is not answering: stopped by a signal (``T``: SIGSTOP,
SIGTSTP), stuck in uninterruptible disk sleep (``D``), or alive but silent (``R``/``S``).
The job keeps its state (a SIGCONT or a disk that comes back lets it go on); ``look`` gives
the fields a status reports of it (``FIELDS``), ``gone`` the words for a supervisor pid that
is a zombie. Used by the helper's probe (``helper/agent.py``), so ``orch status``, ``orch
show`` and ``orch hosts check`` all say the same.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from remote_payload.jobdir.processes import process_state

SILENT_BEATS = 5      # heartbeats a supervisor may miss before it reads as not answering
MIN_SILENT_S = 10.0   # ... and never sooner than this
FIELDS = ("heartbeat_age_s", "not_answering_s", "supervisor_process")  # set by ``look`` only
WORDS = {"R": "running", "S": "sleeping", "D": "disk sleep", "T": "stopped", "t": "stopped by a debugger",
         "Z": "zombie", "X": "dead", "I": "idle", "W": "paging", "P": "parked"}


def silent_after(heartbeat_s: Any) -> float:
    """Seconds without a heartbeat after which a live supervisor is not answering."""
    beat = float(heartbeat_s) if isinstance(heartbeat_s, (int, float)) and not isinstance(heartbeat_s, bool) \
        and 0 < heartbeat_s < 1e6 else 2.0
    return max(SILENT_BEATS * beat, MIN_SILENT_S)


def described(letter: str) -> str:
    """``T (stopped)``: a process state as ``orch show`` and ``orch hosts check`` print it."""
    return "%s (%s)" % (letter, WORDS.get(letter, "unknown state"))


def _why(letter: Optional[str], pid: int) -> str:
    """What a silent supervisor's process state means, with the way on where there is one."""
    if letter == "T":
        return "stopped (SIGSTOP or SIGTSTP; kill -CONT %d on the host resumes it)" % pid
    if letter == "t":
        return "stopped by a debugger (ptrace; detaching it resumes pid %d)" % pid
    if letter == "D":
        return "hung in uninterruptible disk sleep (D: a hung disk or network mount?), pid %d" % pid
    if letter is None:
        return "its process %d just ended" % pid
    return "pid %d is %s but writes no heartbeat (overloaded, or hung)" % (pid, described(letter))


def look(st: Dict[str, Any], heartbeat_s: Any, now: float) -> Dict[str, Any]:
    """What a status reports of the live supervisor of a job that is not terminal:
    ``supervisor_process`` (its state letter and words, ``described``), ``heartbeat_age_s``
    (when status.json has a heartbeat) and, when that age is over ``silent_after``,
    ``not_answering_s`` (the same age) with a ``reason`` that names the process state
    (``supervisor not answering for 43 s: stopped (SIGSTOP ...)``). The job's state is left
    as it is."""
    pid = int(st.get("supervisor_pid") or 0)
    letter = process_state(pid)
    out: Dict[str, Any] = {} if letter is None else {"supervisor_process": described(letter)}
    beat = st.get("heartbeat")
    if not isinstance(beat, (int, float)) or isinstance(beat, bool):
        return out
    age = max(0.0, now - float(beat))
    out["heartbeat_age_s"] = round(age, 1)
    if age > silent_after(heartbeat_s):
        out["not_answering_s"] = round(age, 1)
        out["reason"] = "supervisor not answering for %d s: %s" % (age, _why(letter, pid))
    return out


def gone(pid: int) -> str:
    """Why a supervisor pid that ``pid_alive`` says is not running is not: a zombie (it
    exited, without recording the job's end, and its parent has not reaped it yet), or killed."""
    if process_state(pid) == "Z":
        return ("the supervisor is not running: its process %d exited without recording the job's end "
                "(Z, a zombie its parent has not reaped)" % pid)
    return "the supervisor is not running (killed?)"

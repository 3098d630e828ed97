"""Why a job failed, in one line, from the tail of its node log (standard library only).

The supervisor calls ``reason(job_dir, node_rank, job_id, exit_code)`` when the job's
torchrun exited non-zero. It reads at most ``TAIL_BYTES`` of ``logs/node<N>.log`` (only what
this attempt wrote: the text after the last ``[orch] starting:`` line) and returns e.g.::

    rank 0 on node 0: ValueError: boom (exit code 1); full log: orch logs JOB
    rank 1 on node 0: killed by signal 9 (SIGKILL, out of memory?); full log: orch logs JOB
    torchrun: FileNotFoundError: [Errno 2] No such file or directory: 'foo' (exit code 1); full log: ...
    rank 0 on node 0 exited with code 3; full log: orch logs JOB

Where the facts come from, in order:

- torchrun's error summary ("Root Cause (first observed failure)"): the failing rank, its
  exit code (negative: a signal) and ``error_file`` (written by ``@record``; its ``message``
  is used when the file is readable);
- the worker's own output before torchrun's report: the exception line of the last Python
  traceback (``[rankN]: `` prefixes from torch's excepthook tell ranks apart), else the last
  line that reads like an error (``bash: foo: command not found``, ``can't open file``);
- no summary at all: either a launcher that runs the script as its child and reports the
  child's failure its own way — ``accelerate launch`` with one process raises
  ``subprocess.CalledProcessError`` naming the command (its cause repeats the script's
  stderr), deepspeed's launcher logs ``... exits with return code = N`` — and then the reason
  is the script's, as from a worker: rank 0 of the node when it runs one process (a
  ``[rankN]:`` prefix names another), the child's own exit code or signal, the script's last
  exception before the launcher's report; or the launcher itself failed (bad command,
  rendezvous): its own traceback's exception line, named by the launcher (``torchrun:``,
  ``accelerate:``, ``deepspeed:``, from job.json).

Wherever the script's exception is looked for, a launcher's wrapper of it — a
``CalledProcessError`` naming the command it ran, torchrun's ``ChildFailedError`` — gives way
to the innermost traceback before it: the reason is the script's last exception, whichever
launcher (or bash wrapper of one) ran it.

A direct start (one process, no torchrun: ``direct=True``) has no summary (unless it is a
wrapper that ran torchrun itself: then its summary counts as above): the process is rank
0 of the node, its exit code is the one the supervisor saw, and the message comes from its own
output as above — or, when it could not be started at all, from the supervisor's
``CANNOT_START`` line.

Contract: never raises; the result is one line of printable text, at most ``MAX_REASON``
characters; everything read from the log or an error file is untrusted and bounded.
"""

from __future__ import annotations

import json
import os
import re
import signal
from typing import Dict, List, Optional, Tuple

TAIL_BYTES = 64 * 1024
ERROR_FILE_BYTES = 64 * 1024
MAX_MESSAGE = 300
MAX_REASON = 480
START_MARK = "[orch] starting:"
CANNOT_START = "cannot start:"  # what the supervisor says (as "[orch] cannot start: ...") when a program cannot run

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_RANK_PREFIX = re.compile(r"^\[rank(\d+)\]:\s?(.*)$")
_TORCHRUN_NOTICED = re.compile(r"\] failed \(exitcode: -?\d+\) local_rank: \d+")
_SUMMARY_FIELD = re.compile(r"^\s*(rank|exitcode|error_file)\s*:\s*(.*?)\s*$")
_ERRORISH = re.compile(r"(\b[A-Za-z_.]*(Error|Exception)\b|\berror:|\bERROR\b|command not found|No such file or directory|"
                       r"can't open file|cannot |Permission denied|\bfatal\b|FATAL|Segmentation fault|core dumped|"
                       r"\bKilled\b|\bAborted\b)")
_ERRORISH_WINDOW = 40  # only this many last lines of the worker's output are searched for one
# A launcher's report of the child it ran (accelerate's simple launcher; subprocess.run(check=True) in a wrapper):
_CALLED = re.compile(r"^(?:subprocess\.)?CalledProcessError: Command .*?(?:returned non-zero exit status (-?\d+)|"
                     r"died with <Signals\.\w+: (\d+)>)\.?\s*$")
_DEEPSPEED_EXIT = re.compile(r"\bexits with return code = (-?\d+)\s*$")  # deepspeed.launcher.launch's last line
_REPORT_LAST = 5
_CHAINED = ("The above exception was the direct cause", "During handling of the above exception")
_EXCEPTION_HEAD = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` without escape sequences or control characters, whitespace collapsed, cut."""
    text = " ".join(_CONTROL.sub(" ", _ANSI.sub("", text)).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def read_tail(path: str, limit: int = TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``path`` as text (after the last START_MARK); '' if unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            data = f.read(limit)
    except OSError:
        return ""
    text = data.decode("utf-8", "replace")
    start = text.rfind(START_MARK)
    if start >= 0:
        text = text[text.find("\n", start) + 1:] if "\n" in text[start:] else ""
    return text


def _lines(text: str) -> List[str]:
    """Log text as lines; a carriage return (progress bars) also ends a line."""
    return [_ANSI.sub("", line) for line in re.split(r"\r\n|\r|\n", text)]


def root_cause(lines: List[str]) -> Optional[Dict[str, str]]:
    """torchrun's first observed failure: {"rank", "exitcode", "error_file"} (values as text)."""
    for i, line in enumerate(lines):
        if line.strip().startswith("Root Cause (first observed failure)"):
            found: Dict[str, str] = {}
            for field in lines[i + 1:i + 12]:
                m = _SUMMARY_FIELD.match(field)
                if m and m.group(1) not in found:
                    found[m.group(1)] = m.group(2)
                if field.startswith("====="):
                    break
            return found
    return None


def _exception_lines(lines: List[str]) -> List[Tuple[Optional[int], str]]:
    """(rank or None, exception line) of every complete Python traceback, in log order."""
    in_traceback: Dict[Optional[int], bool] = {}
    found: List[Tuple[Optional[int], str]] = []
    for raw in lines:
        m = _RANK_PREFIX.match(raw)
        rank, text = (int(m.group(1)), m.group(2)) if m else (None, raw)
        if text.startswith("Traceback (most recent call last):"):
            in_traceback[rank] = True
        elif in_traceback.get(rank) and text.strip() and not text[:1].isspace():
            in_traceback[rank] = False
            if "ChildFailedError" not in text:  # torchrun's report about the worker, not the cause
                found.append((rank, text))
    own = [f for f in found if not _CALLED.match(f[1])]  # a launcher's wrapper gives way to the script's own
    return own or found


def _child_failure(lines: List[str]) -> Optional[Tuple[int, int]]:
    """(where a launcher's report of its failed child begins, the child's exit code: negative
    for a signal) when the log ends with one (among its last ``_REPORT_LAST`` lines) — accelerate's ``CalledProcessError`` traceback
    (with the chained cause that repeats the child's stderr), deepspeed's ``exits with return
    code`` line — else None."""
    tail = [i for i in range(len(lines) - 1, -1, -1) if lines[i].strip() and not lines[i].startswith("[orch]")]
    for i in tail[:_REPORT_LAST]:
        m = _CALLED.match(lines[i])
        if m:
            code = int(m.group(1)) if m.group(1) is not None else -int(m.group(2))
            return _report_start(lines, i), code
        m = _DEEPSPEED_EXIT.search(lines[i])
        if m:
            start = next((j for j in range(i, -1, -1) if "sigkill_handler]" not in lines[j]), i) + 1
            return min(start, i), int(m.group(1))
    return None


def _report_start(lines: List[str], end: int) -> int:
    """The first line of the traceback ending at ``end``, a chained cause printed before it included."""
    start = next((j for j in range(end, -1, -1) if lines[j].startswith("Traceback (most recent call last):")), end)
    j = start - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j >= 0 and lines[j].startswith(_CHAINED):
        heads = [k for k in range(j) if _EXCEPTION_HEAD.match(lines[k]) and (k == 0 or not lines[k - 1][:1].isspace())]
        if heads:
            return heads[-1]
    return start


def _errorish_line(lines: List[str]) -> Optional[str]:
    for raw in reversed([line for line in lines if line.strip() and not line.startswith("[orch]")][-_ERRORISH_WINDOW:]):
        m = _RANK_PREFIX.match(raw)
        text = m.group(2) if m else raw
        if _ERRORISH.search(text) and not text.lstrip().startswith(("warnings.warn", "File ")):
            return text
    return None


def _error_file_message(path: str) -> Optional[str]:
    """``message`` of a torchelastic error file (``@record``), if it is a small regular file."""
    if not path or path.startswith("<") or not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(ERROR_FILE_BYTES).decode("utf-8", "replace"))
        message = data["message"]
        message = message.get("message") if isinstance(message, dict) else message
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return message.strip().splitlines()[-1] if isinstance(message, str) and message.strip() else None


def signal_name(signum: int) -> str:
    """``SIGKILL, out of memory?`` — a SIGKILL nobody asked for is most often the OOM killer."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = "unknown signal"
    return name + (", out of memory?" if signum == signal.SIGKILL else "")


def signal_text(signum: int) -> str:
    """``killed by signal 9 (SIGKILL, out of memory?)``."""
    return "killed by signal %d (%s)" % (signum, signal_name(signum))


TERMINATE = "terminate called without an active exception"


def worker_signal(who: str, signum: int, lines: List[str]) -> str:
    """``who: killed by signal N (NAME)``; a SIGABRT after the C++ runtime's ``TERMINATE``
    line says so and names the likely cause: PyTorch's gloo teardown race at interpreter exit
    (a gloo worker thread taking the GIL while the interpreter finalizes, pytorch/pytorch#190489)."""
    text = "%s: %s" % (who, signal_text(signum))
    if signum == signal.SIGABRT and any(TERMINATE in line for line in lines[-400:]):
        text += " after '%s' (at exit, with gloo: PyTorch's teardown race, pytorch/pytorch#190489)" % TERMINATE
    return text


def _int(text: Optional[str]) -> Optional[int]:
    m = re.match(r"\s*(-?\d+)", text or "")
    return int(m.group(1)) if m else None


def explain(text: str, node_rank: int, exit_code: int, launcher: str = "torchrun", nproc: int = 0,
            first_rank: int = 0) -> str:
    """The failure sentence (without the log hint) from this attempt's log text. ``launcher``
    names what ran the job (job.json's node ``launcher``), ``nproc`` the processes it ran on
    this node (0: unknown) and ``first_rank`` the global rank of the node's first one."""
    lines = _lines(text)
    cut = next((i for i, line in enumerate(lines) if _TORCHRUN_NOTICED.search(line)), None)
    summary = root_cause(lines)
    if summary is None and cut is None:  # torchrun never reported a worker
        child = _child_failure(lines)
        if child is not None:  # a launcher that reports its child its own way: the script failed
            at, code = child
            exceptions = _exception_lines(lines[:at])
            ranked = [r for r, _ in exceptions if r is not None]
            rank = ranked[-1] if ranked else first_rank if nproc == 1 else None
            who = "rank %s on node %d" % (rank if rank is not None else "?", node_rank)
            if code < 0:
                return worker_signal(who, -code, lines[:at])
            return _worker_sentence(who, lines[:at], code, rank=rank)
        if exit_code < 0:  # the launcher failed itself
            return "%s %s" % (launcher, signal_text(-exit_code))
        exceptions = _exception_lines(lines)
        if exceptions:
            return "%s: %s (exit code %d)" % (launcher, one_line(exceptions[-1][1]), exit_code)
        errorish = _errorish_line(lines)
        if errorish:
            return "%s (exit code %d)" % (one_line(errorish), exit_code)
        return "job exited with code %d" % exit_code
    summary = summary or {}
    rank = _int(summary.get("rank"))
    code = _int(summary.get("exitcode"))
    code = exit_code if code is None else code
    who = "rank %s on node %d" % (rank if rank is not None else "?", node_rank)
    if code < 0:
        return worker_signal(who, -code, lines[:cut] if cut is not None else lines)
    worker = lines[:cut] if cut is not None else lines
    return _worker_sentence(who, worker, code, _error_file_message(summary.get("error_file", "")), rank)


def _worker_sentence(who: str, worker: List[str], code: int, message: Optional[str] = None,
                     rank: Optional[int] = None) -> str:
    """``who: message (exit code C)`` from the worker's output (``message`` first if given)."""
    if message is None:
        exceptions = _exception_lines(worker)
        mine = [e for r, e in exceptions if r == rank] if rank is not None else []
        message = (mine or [e for _, e in exceptions] or [None])[-1]
    if message is None:
        message = _errorish_line(worker)
    if message is None:
        hint = " (128+%d: %s)" % (code - 128, signal_name(code - 128)) if 128 < code < 160 else ""
        return "%s exited with code %d%s" % (who, code, hint)
    return "%s: %s (exit code %d)" % (who, one_line(message), code)


# What a script that wants torchrun's variables says when started as plain python (no RANK ...).
_WANTS_TORCHRUN = re.compile(r"KeyError: '(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT)'|"
                             r"environment variable (RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT) expected")
PLAIN_HINT = ("; started as plain python, without torchrun's variables: write torchrun in launch.command or "
              "set launch.launcher: direct")


def explain_direct(text: str, node_rank: int, exit_code: int, plain: bool = False) -> str:
    """The failure sentence for a direct start: the one process is rank 0 of node ``node_rank``.
    ``plain`` (started with none of torchrun's variables): a script that failed for want of
    one (``KeyError: 'LOCAL_RANK'``, torch's "environment variable RANK expected") is told how
    to get them."""
    sentence = _explain_direct(text, node_rank, exit_code)
    return sentence + PLAIN_HINT if plain and _WANTS_TORCHRUN.search(sentence) else sentence


def _explain_direct(text: str, node_rank: int, exit_code: int) -> str:
    lines = _lines(text)
    if root_cause(lines) is not None:  # a wrapper (bash) that ran torchrun: its summary names the rank
        return explain(text, node_rank, exit_code)
    who = "rank 0 on node %d" % node_rank
    if exit_code < 0:
        return worker_signal(who, -exit_code, lines)
    mark = "[orch] " + CANNOT_START
    cannot = [line[len(mark):].strip() for line in lines if line.startswith(mark)]
    return _worker_sentence(who, lines, exit_code, cannot[-1] if cannot else None)


def reason(job_dir: str, node_rank: int, job_id: str, exit_code: int, direct: bool = False,
           plain: bool = False) -> str:
    """One line for ``status.json``'s ``reason``: the failure and where the full log is.
    ``direct``: the job was started without torchrun (``explain_direct``; ``plain``: with none
    of its variables). The launcher and the node's processes are read from job.json."""
    try:
        text = read_tail(os.path.join(job_dir, "logs", "node%d.log" % node_rank))
        if direct:
            sentence = explain_direct(text, node_rank, exit_code, plain)
        else:
            sentence = explain(text, node_rank, exit_code, *_node_facts(job_dir, node_rank))
        sentence = sentence.replace(os.path.join(job_dir, "code") + os.sep, "")
    except Exception:  # noqa: BLE001 - a failure report must never fail the supervisor
        sentence = "job exited with code %d" % exit_code
    return one_line("%s; full log: orch logs %s" % (sentence, job_id), MAX_REASON)


def _node_facts(job_dir: str, node_rank: int) -> Tuple[str, int, int]:
    """(the launcher's name, the processes it runs on this node, the global rank of the node's
    first one) from job.json; ("torchrun", 0, 0) where it does not say."""
    try:
        with open(os.path.join(job_dir, "job.json"), "rb") as f:
            nodes = json.loads(f.read(ERROR_FILE_BYTES * 16).decode("utf-8", "replace")).get("nodes")
        counts = [int(n.get("nproc") or 0) for n in nodes]
        launcher = str(nodes[node_rank].get("launcher") or "torchrun")
    except (OSError, ValueError, AttributeError, TypeError, IndexError, KeyError):
        return "torchrun", 0, 0
    return one_line(launcher, 40), counts[node_rank], sum(counts[:node_rank])

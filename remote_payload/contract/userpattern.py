"""A user's regular expression (``launch.progress``) run where it can never stall orch.

Python's ``re`` backtracks: ``(x+x+)+y`` on a line of 40 ``x`` runs for days, in C, holding
the GIL, so no other thread and no Python signal handler of that process runs meanwhile. A
pattern from a job is therefore never searched in the process that asked: ``PatternWorker``
runs it in a child Python (this file as a script, standard library only, Python >= 3.8) and
each search there gets ``budget_s`` seconds of CPU (``ITIMER_PROF``, whose default action the
kernel carries out: the worker ends even while the regex holds the GIL). The asking thread
waits in ``select`` (the GIL released) with a wall-clock backstop of ``WALL_S`` per reply.

Contract: ``search_all`` never takes longer than ``WALL_S`` per line and never raises; the
first line that blows the budget (or a worker that ends, or answers nonsense) switches the
pattern off for good — ``off`` then says why, in words, and every later search answers None.
A worker whose asker is gone reads end-of-file and exits; one stuck in a search ends at its
budget. Used by the supervisor's metrics watch (one worker per job node) and by the laptop's
check of ``launch.progress`` (orchestrator/checks/progress.py).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence

LINE_BUDGET_S = 1.0  # CPU seconds one search of one line may take
WALL_S = 60.0  # the asker's backstop per reply (a worker stopped or starved of CPU on a loaded box)
MAX_REPLY = 1 << 20  # a reply line longer than this is nonsense


def _serve() -> None:
    """The worker: the first line of stdin is ``{"pattern", "budget_s"}``, answered with
    ``{"ok": true}`` or ``{"error": "..."}``; then each line is a JSON string, answered with a
    line: ``null`` (no match) or the match's named groups that matched (name -> text)."""
    import re

    signal.signal(signal.SIGPROF, signal.SIG_DFL)  # the budget: the kernel ends this process
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the asker
    out = sys.stdout

    def reply(value: object) -> None:
        out.write(json.dumps(value) + "\n")
        out.flush()

    first = sys.stdin.readline()
    if not first:
        return
    init = json.loads(first)
    budget = float(init["budget_s"])
    signal.setitimer(signal.ITIMER_PROF, budget)
    try:
        pattern = re.compile(init["pattern"])
    except Exception as exc:  # noqa: BLE001 - re.error, RecursionError, OverflowError ...
        signal.setitimer(signal.ITIMER_PROF, 0)
        reply({"error": "%s: %s" % (type(exc).__name__, exc)})
        return
    signal.setitimer(signal.ITIMER_PROF, 0)
    reply({"ok": True})
    for line in sys.stdin:
        text = json.loads(line)
        signal.setitimer(signal.ITIMER_PROF, budget)
        try:
            m = pattern.search(text)
        except Exception:  # noqa: BLE001 - RecursionError, MemoryError: no match
            m = None
        signal.setitimer(signal.ITIMER_PROF, 0)
        reply(None if m is None else {k: v for k, v in m.groupdict().items() if isinstance(v, str)})


class PatternWorker:
    """``pattern`` searched in a worker process, each line under ``budget_s`` of CPU.

    ``pid``: the worker's (the supervisor keeps it out of the job's process tree); ``off``:
    None while the pattern is in use, else why it is not (said in words, e.g. ``it took more
    than 1 s of CPU on a line of 40 characters``); ``compile_error``: set when the pattern is
    no regular expression for the worker's Python."""

    def __init__(self, pattern: str, budget_s: float = LINE_BUDGET_S, python: Optional[str] = None,
                 wall_s: float = WALL_S) -> None:
        self.budget_s, self.wall_s = budget_s, wall_s
        self.off: Optional[str] = None
        self.compile_error: Optional[str] = None
        self._buf = b""
        self.proc: Optional[subprocess.Popen] = None
        try:
            self.proc = subprocess.Popen([python or sys.executable, "-I", "-S", os.path.abspath(__file__)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         close_fds=True)
        except OSError as exc:
            self.off = "its worker could not start: %s" % exc
            return
        answer = self._ask([json.dumps({"pattern": pattern, "budget_s": budget_s})], [len(pattern)], "compiling it")
        if answer and isinstance(answer[0], dict) and "error" in answer[0]:
            self.compile_error = str(answer[0]["error"])
            self._end("it is not a regular expression this Python reads (%s)" % self.compile_error)
        elif self.off is None and not (answer and answer[0] == {"ok": True}):
            self._end("its worker answered %r" % (answer[:1],))

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None else None

    def search_all(self, lines: Sequence[str]) -> List[Optional[Dict[str, str]]]:
        """Each line's named groups (those that matched) or None: no match, or the pattern is
        off (``off`` says why; it goes off at the first line that blows the budget)."""
        if self.off is not None or not lines:
            return [None] * len(lines)
        answers = self._ask([json.dumps(line) for line in lines], [len(line) for line in lines], "a line")
        found: List[Optional[Dict[str, str]]] = []
        for answer in answers:
            if answer is not None and not (isinstance(answer, dict) and all(
                    isinstance(k, str) and isinstance(v, str) for k, v in answer.items())):
                self._end("its worker answered %r" % (answer,))
                break
            found.append(answer)
        return found + [None] * (len(lines) - len(found))

    def _ask(self, requests: List[str], lengths: List[int], what: str) -> List[object]:
        """Send ``requests`` (JSON texts, one a line; ``lengths``: the characters of what each
        carries, for the words of ``off``) and read one answer each, writing and
        reading together (a worker stuck in a search never blocks a write here) and waiting
        at most ``wall_s`` for each answer. Stops at the first failure (``off`` set)."""
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        out_fd, in_fd = self.proc.stdout.fileno(), self.proc.stdin.fileno()
        os.set_blocking(in_fd, False)
        data = memoryview("".join(r + "\n" for r in requests).encode("utf-8", "surrogatepass"))
        answers: List[object] = []
        deadline = time.monotonic() + self.wall_s
        while len(answers) < len(requests):
            wait = deadline - time.monotonic()
            if wait <= 0:
                self._end("it gave no answer within %.0f s on %s of %d characters" % (
                    self.wall_s, what, lengths[len(answers)]))
                return answers
            readable, writable, _ = select.select([out_fd], [in_fd] if data else [], [], wait)
            if writable:
                try:
                    data = data[os.write(in_fd, data[:1 << 16]):]
                except BlockingIOError:
                    pass
                except OSError:  # the worker is gone: its answers so far are read below
                    data = data[:0]
            if not readable:
                continue
            chunk = os.read(out_fd, 1 << 16)
            if not chunk:
                self._ended(what, lengths[len(answers)])
                return answers
            self._buf += chunk
            while b"\n" in self._buf and len(answers) < len(requests):
                line, self._buf = self._buf.split(b"\n", 1)
                try:
                    answers.append(json.loads(line.decode("utf-8")))
                except ValueError:
                    self._end("its worker answered something that is not JSON")
                    return answers
                deadline = time.monotonic() + self.wall_s
            if len(self._buf) > MAX_REPLY:
                self._end("its worker answered a line over %d bytes" % MAX_REPLY)
                return answers
        return answers

    def _ended(self, what: str, size: int) -> None:
        """The worker closed its output: it ended. Say why, in words."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        if code == -signal.SIGPROF:
            self._end("it took more than %g s of CPU on %s of %d characters" % (self.budget_s, what, size))
        else:
            self._end("its worker ended (%s) on %s of %d characters" % (
                "signal %d" % -code if code is not None and code < 0 else "exit code %s" % code, what, size))

    def _end(self, why: str) -> None:
        if self.off is None:
            self.off = why
        self.close()

    def close(self) -> None:
        """Stop the worker (it ends at end-of-file; killed if it is still there after a moment)
        and reap it. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()  # type: ignore[union-attr]
            except OSError:
                pass
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    _serve()

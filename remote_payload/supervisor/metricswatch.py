"""The supervisor's metrics watcher: follow the node log, append what ``scrape`` recognises
to ``metrics.jsonl`` (standard library only, Python >= 3.8).

``watch(job_dir, node_rank, say, env)`` starts it just before the job and returns an object
whose ``stop()`` (after the job ended) reads the rest of the log, writes what is pending,
and waits for that. It is the supervisor's duty ``metrics from the log`` (``jobdir/duties.py``:
an error is said once in the node's log and the next poll tries again). See scrape.py for what
is recognised and for the contracts: never for the built-in trainer, yields to a job that
writes ``metrics.jsonl`` itself, bounded, and never raises into the supervisor. Every row it writes carries ``"attempt": N`` when the job's
env has ``ORCH_ATTEMPT`` (``orch plot`` draws each attempt as its own segment); job.json's
``progress`` (``launch.progress``) is the job's own progress-line regex: searched only in a
worker process (``contract/userpattern.py``), each line under ``LINE_BUDGET_S`` of CPU; a
pattern that blows it is switched off for the rest of the attempt, said once in the log and
handed to ``note`` (the supervisor shows it in status.json's ``reason``). The worker's pid is
never the job's (``helper_pids``).

One row per step: a row read from the log whose step, epoch and kind (train or eval) a row of
this attempt already had is not written again (``Once``) — processes that each print the same
line (Hugging Face's Trainer in ranks that each train alone, a script printing on every rank)
give the first one's row, however far apart they print it. A step-less row is left to the
parser's own repeat rule (scrape.py, ``SAME_S``).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional

from remote_payload.contract import settings
from remote_payload.contract.userpattern import PatternWorker
from remote_payload.jobdir.duties import Duty, describe
from remote_payload.supervisor import scrape

FINAL_READ_BYTES = 64 << 20  # at most this much of a log is read after the job ended
STOP_WAIT_S = 60.0  # the supervisor waits at most this long for the last pass
MAX_JOB_JSON = 16 << 20
MAX_STEPS_KEPT = 1 << 16  # the steps ``Once`` remembers (oldest forgotten first)


class Once:
    """Pure: whether a row read from the log is the first with its step, epoch and kind."""

    def __init__(self, limit: int = MAX_STEPS_KEPT) -> None:
        self.limit = limit
        self.seen: "OrderedDict[tuple, None]" = OrderedDict()

    def first(self, row: Dict[str, Any]) -> bool:
        step = row.get("step")
        if not isinstance(step, int):
            return True
        key = (step, row.get("epoch"), "loss" in row, "eval_loss" in row)
        if key in self.seen:
            return False
        self.seen[key] = None
        if len(self.seen) > self.limit:
            self.seen.popitem(last=False)
        return True


class MetricsFile:
    """Appends rows to ``path`` only while nobody else writes it."""

    def __init__(self, path: str, say: Callable[[str], None]) -> None:
        self.path, self.say = path, say
        self.expected: Optional[int] = self._size()
        self.enabled = self.expected == 0 or self._last_is_ours()

    def _size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except OSError:
            return 0

    def _last_is_ours(self) -> bool:
        """A resumed attempt continues a file this watcher wrote; any other writer wins."""
        try:
            with open(self.path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - 65536))
                last = [line for line in f.read().splitlines() if line.strip()][-1]
            return json.loads(last.decode("utf-8", "replace")).get("source") in scrape.SOURCES
        except (OSError, IndexError, ValueError, AttributeError):
            return False

    def append(self, rows: List[Dict[str, Any]]) -> None:
        if not rows or not self.enabled:
            return
        if self._size() != self.expected:
            self.enabled = False
            self.say("metrics.jsonl is written by the job itself: rows read from the log are no longer added")
            return
        data = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows).encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        self.expected = (self.expected or 0) + len(data)


class Watcher:
    def __init__(self, job_dir: str, node_rank: int, say: Callable[[str], None], attempt: Optional[int] = None,
                 progress: Optional[PatternWorker] = None, note: Callable[[str], None] = lambda _: None) -> None:
        self.job_dir, self.say, self.attempt, self.note = job_dir, say, attempt, note
        self.log_path = os.path.join(job_dir, "logs", "node%d.log" % node_rank)
        self.offset = self._log_size()
        self.progress = progress
        self.parser = scrape.LineParser(progress=progress)
        self.out = MetricsFile(os.path.join(job_dir, "metrics.jsonl"), say)
        self.last_train = self.last_eval = -1.0
        self.once = Once()
        self.state_seen: Optional[tuple] = None
        self.floor = self._earlier_state()
        self.next_scan = time.time() + scrape.STATE_SCAN_S
        self.duty = Duty("metrics from the log", scrape.POLL_S, self.poll, say, last=self.drain)

    def _log_size(self) -> int:
        try:
            return os.stat(self.log_path).st_size
        except OSError:
            return 0

    def start(self) -> "Watcher":
        self.duty.start()
        return self

    def stop(self) -> None:
        """After the job ended: the last pass (``drain``) on the duty's thread, waited for at
        most ``STOP_WAIT_S``."""
        self.duty.stop(wait_s=STOP_WAIT_S)
        if self.progress is not None:
            self.progress.close()

    def helper_pids(self) -> "set[int]":
        """The processes this watcher runs (the pattern's worker): never the job's."""
        pid = self.progress.pid if self.progress is not None else None
        return {pid} if pid else set()

    def _progress_off(self) -> None:
        """Once ``launch.progress`` went off (a line blew its budget): say it, once, and note it."""
        if self.progress is None or self.progress.off is None:
            return
        why, self.progress = self.progress.off, None
        self.parser.progress = None
        text = ("launch.progress is switched off for this job: %s; only the built-in formats are read from now on "
                "(a repeat inside a repeat, like (x+)+, can take exponential time: docs/own-script.md)" % why)
        self.say(text)
        self.note(text)

    def _write(self, rows: List[Dict[str, Any]], read: bool = True) -> None:
        """Append ``rows`` (``read``: from the log, each step once: ``Once``)."""
        rows = [row for row in rows if not read or self.once.first(row)]
        for row in rows:
            if self.attempt is not None:
                row["attempt"] = self.attempt
            if "step" in row:
                if "loss" in row:
                    self.last_train = max(self.last_train, row["step"])
                if "eval_loss" in row:
                    self.last_eval = max(self.last_eval, row["step"])
        self.out.append(rows)

    def _read_log(self, budget: int) -> None:
        """Feed new log bytes (at most ``budget``) to the parser; a log not there yet is no
        news, any other error raises (to the duty: said once, the next poll tries again)."""
        try:
            f = open(self.log_path, "rb")
        except FileNotFoundError:
            return
        with f:
            f.seek(self.offset)
            while budget > 0:
                chunk = f.read(min(scrape.MAX_READ, budget))
                if not chunk:
                    break
                self.offset += len(chunk)
                budget -= len(chunk)
                self._write(self.parser.feed(chunk.decode("utf-8", "replace")))
                self._progress_off()

    def _earlier_state(self) -> float:
        """The step of the newest ``trainer_state.json`` already there when this attempt began
        (an earlier attempt's checkpoint, the one a resume loads), else -1: its ``log_history``
        is that attempt's, and a resumed Trainer copies it into every checkpoint it writes, so
        no state row at or below it is this attempt's."""
        state = self._read_state(scrape.find_trainer_state(self.job_dir))
        step = scrape.number(state.get("global_step")) if state is not None else None
        return float(step) if step is not None else -1.0

    def _read_state(self, path: Optional[str]) -> Optional[Dict[str, Any]]:
        """The trainer_state.json at ``path`` when it changed since the last read, else None."""
        if path is None:
            return None
        try:
            st = os.stat(path)
            if (path, st.st_mtime_ns, st.st_size) == self.state_seen or st.st_size > scrape.MAX_STATE_BYTES:
                return None
            self.state_seen = (path, st.st_mtime_ns, st.st_size)
            with open(path, "rb") as f:
                state = json.loads(f.read(scrape.MAX_STATE_BYTES).decode("utf-8", "replace"))
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) else None

    def _scan_state(self) -> None:
        state = self._read_state(scrape.find_trainer_state(self.job_dir))
        if state is not None:
            rows, total = scrape.state_rows(state, max(self.last_train, self.floor), max(self.last_eval, self.floor),
                                            time.time())
            if total and not self.parser.total:
                self.parser.total = total
            self._write(rows, read=False)

    def poll(self) -> None:
        """One period of the duty: the new lines of the log (a bounded read), the rows pending
        too long, and every ``STATE_SCAN_S`` the newest ``trainer_state.json``."""
        self._read_log(8 * scrape.MAX_READ)
        self._write(self.parser.flush(older_than=scrape.PENDING_MAX_S))
        if time.time() >= self.next_scan:
            self._scan_state()
            self.next_scan = time.time() + scrape.STATE_SCAN_S

    def drain(self) -> None:
        """The last pass, once the job ended: the rest of the log (at most ``FINAL_READ_BYTES``),
        every pending row, the newest ``trainer_state.json``."""
        self._read_log(FINAL_READ_BYTES)
        self._write(self.parser.feed("\n") + self.parser.flush())
        self._progress_off()
        self._scan_state()


class _Off:
    def stop(self) -> None:
        pass

    def helper_pids(self) -> "set[int]":
        return set()


def attempt_of(env: Dict[str, str]) -> Optional[int]:
    """``ORCH_ATTEMPT`` (1, 2, ...) of the job's env as an int; None when unset or not one."""
    value = str(env.get(settings.ATTEMPT, "")).strip()
    return int(value) if re.fullmatch(r"[0-9]{1,9}", value) else None


def progress_pattern(job_dir: str, say: Callable[[str], None]) -> Optional[PatternWorker]:
    """job.json's ``progress`` in a started worker (``PatternWorker``), or None: unset,
    unreadable, or not a regular expression for this Python (it was checked on the laptop,
    whose Python may be newer: said with ``say``)."""
    try:
        with open(os.path.join(job_dir, "job.json"), "rb") as f:
            text = json.loads(f.read(MAX_JOB_JSON).decode("utf-8", "replace")).get("progress")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(text, str) or not text:
        return None
    worker = PatternWorker(text)
    if worker.off is not None:
        say("launch.progress is not used: %s; only the built-in formats are read" % worker.off
            if worker.compile_error is None else
            "launch.progress is not a regular expression this Python reads (%s): only the built-in formats "
            "are read" % worker.compile_error)
        return None
    return worker


def watch(job_dir: str, node_rank: int, say: Callable[[str], None], env: Dict[str, str],
          note: Callable[[str], None] = lambda _: None) -> Any:
    """A started Watcher, or an object whose ``stop`` does nothing (and ``helper_pids`` is
    empty): for the built-in trainer (it writes its own metrics), when the job's env sets
    ``ORCH_METRICS_FROM_LOG=0``, and when the watcher cannot start (said with ``say``).
    ``note`` hears once that ``launch.progress`` was switched off."""
    try:
        if os.path.exists(os.path.join(job_dir, "train.json")) or not settings.metrics_from_log(env):
            return _Off()
        return Watcher(job_dir, node_rank, say, attempt_of(env), progress_pattern(job_dir, say), note).start()
    except Exception as exc:  # noqa: BLE001 - metrics are a convenience: said, never a failed job
        say("metrics from the log are not read: %s" % describe(exc))
        return _Off()

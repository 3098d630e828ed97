"""Ranks that never all joined: the supervisor's watch of a process group forming in the job's
log (standard library only, Python >= 3.8).

A framework that starts its own processes (Lightning's ``Trainer(devices=N)``, ``mp.spawn``,
accelerate's ``notebook_launcher``) prints that its group is forming and then waits in
``init_process_group`` until every member joined. When one never comes — its launcher never
started it (Lightning reading torchrun's variables as "launched by torchelastic"), it died
while importing — the job would sit at ``running`` with no hint. This watch makes status.json's
reason say so.

What it reads (``Joins``), line by line from the node's log (its own offset, at most
``MAX_READ`` bytes a poll; ``[orch]`` lines are the supervisor's, not the job's):

- Lightning's (and Fabric's) ``Initializing distributed: GLOBAL_RANK: g, MEMBER: m/N``, which
  each rank prints just before it waits, ended by rank 0's ``All distributed processes
  registered. Starting with N processes`` once all joined. torch's own rendezvous prints
  nothing while it waits (its store barrier logs at DEBUG), so there is nothing more to read.

When it speaks (``Joins.waiting``): the group forming holds this node's rank 0 (``MEMBER
1/N``: only rank 0 prints the end, so a node without it cannot tell), fewer than N members were
seen, and for ``WAIT_S`` since rank 0's line neither the end nor any other line of the job's
came. Then the reason is ``waiting for ranks: 1 of 2 joined (Lightning's MEMBER 1/2, 5 min
ago)`` (members counted from this node's log); it is said once in the node's log, and taken
back (``joined``) when the end or any other line of the job's comes. ``watch`` hands each
change of the reason to ``note`` (None: taken back). It never raises into the supervisor: it
is a ``Duty`` with the shared error policy.
"""

from __future__ import annotations

import os
import re
import time
from typing import Callable, Optional, Set, Union

from remote_payload.contract import testhooks
from remote_payload.jobdir.duties import Duty, describe

WAIT_S = 120.0  # a child process importing torch and a framework on a cold disk can take a minute
POLL_S = 2.0
MAX_READ = 1 << 20  # bytes of new log read in one poll (a job printing faster is not waiting)
STOP_WAIT_S = 10.0  # a poll reads one bounded chunk: it ends well within this
MAX_LINE = 8192  # the unfinished tail kept between polls; longer is cut (it is output all the same)

MEMBER = re.compile(r"Initializing distributed: GLOBAL_RANK: (\d{1,7}), MEMBER: (\d{1,7})/(\d{1,7})")
FORMED = re.compile(r"All distributed processes registered\. Starting with \d{1,7} processes")
ORCH_LINE = "[orch] "


def ago(seconds: float) -> str:
    """``40 s``, ``5 min``, ``3 h``."""
    s = int(max(seconds, 0))
    if s < 120:
        return "%d s" % s
    if s < 7200:
        return "%d min" % (s // 60)
    return "%d h" % (s // 3600)


class Joins:
    """Pure: the process group forming as the log's lines tell it (``line``), and the reason
    while its ranks have not all joined (``waiting``)."""

    def __init__(self) -> None:
        self.world = 0
        self.members: Set[int] = set()
        self.formed = True  # nothing forming yet
        self.first_at = 0.0  # when rank 0's MEMBER line came
        self.output_at = 0.0  # the job's last line that was neither a MEMBER line nor orch's

    def line(self, text: str, now: float) -> None:
        if text.startswith(ORCH_LINE) or not text.strip():
            return
        found = MEMBER.search(text)
        if found is None:
            self.formed = self.formed or FORMED.search(text) is not None
            self.output_at = now
            return
        member, world = int(found.group(2)), int(found.group(3))
        if self.formed or world != self.world:  # a group begins forming
            self.world, self.members, self.formed, self.first_at = world, set(), False, now
        if member == 1 and 1 not in self.members:
            self.first_at = now
        self.members.add(member)

    def waiting(self, now: float, wait_s: float = WAIT_S) -> Optional[str]:
        """The reason status shows, or None (formed, not this node's rank 0, all seen, or not
        ``wait_s`` quiet yet)."""
        if self.formed or 1 not in self.members or len(self.members) >= self.world:
            return None
        if now - self.first_at < wait_s or now - self.output_at < wait_s:
            return None
        return "waiting for ranks: %d of %d joined (Lightning's MEMBER 1/%d, %s ago)" % (
            len(self.members), self.world, self.world, ago(now - self.first_at))


class JoinWatch:
    """The duty: new lines of ``log_path`` into ``Joins``, each change of its reason to ``note``
    and, once each way, into the node's log with ``say``."""

    def __init__(self, log_path: str, say: Callable[[str], None], note: Callable[[Optional[str]], None],
                 wait_s: float = WAIT_S) -> None:
        self.log_path, self.say, self.note, self.wait_s = log_path, say, note, wait_s
        self.joins = Joins()
        try:
            self.offset = os.stat(log_path).st_size  # the job's lines come after what is there now
        except OSError:
            self.offset = 0
        self.tail = b""
        self.reason: Optional[str] = None
        self.duty = Duty("ranks joining", POLL_S, self.poll, say)

    def stop(self) -> None:
        """No note after this returns (a poll in progress is waited for)."""
        self.duty.stop(wait_s=STOP_WAIT_S)

    def poll(self) -> None:
        now = time.time()
        with open(self.log_path, "rb") as f:  # the supervisor's own log, there from its start
            f.seek(self.offset)
            data = f.read(MAX_READ)
        self.offset += len(data)
        lines = (self.tail + data).split(b"\n")
        self.tail = lines.pop()[-MAX_LINE:]
        for raw in lines:
            self.joins.line(raw.decode("utf-8", "replace"), now)
        reason = self.joins.waiting(now, self.wait_s)
        if reason == self.reason:
            return
        if self.reason is None or reason is None:  # said once each way; the "ago" changes only in status
            self.say(reason or "the job went on: no longer %s" % self.reason.split(" (")[0])
        self.reason = reason
        self.note(reason)


class _Off:
    def stop(self) -> None:
        pass


def watch(job_dir: str, node_rank: int, say: Callable[[str], None],
          note: Callable[[Optional[str]], None]) -> Union[JoinWatch, _Off]:
    """A started ``JoinWatch`` of the node's log (``logs/node<N>.log``), its wait
    ``testhooks.join_wait_s`` of the host's root when the test harness set one; or, when it
    cannot start (said with ``say``), an object whose ``stop`` does nothing."""
    try:
        root = os.path.dirname(os.path.dirname(job_dir))
        wait_s = testhooks.join_wait_s(root) or WAIT_S
        watcher = JoinWatch(os.path.join(job_dir, "logs", "node%d.log" % node_rank), say, note, wait_s)
        watcher.duty.start()
        return watcher
    except Exception as exc:  # noqa: BLE001 - a hint in status, never a failed job
        say("ranks joining are not watched: %s" % describe(exc))
        return _Off()

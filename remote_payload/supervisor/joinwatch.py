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

Ranks that each trained alone: a process started as one of several that found no process
group and ran the whole training by itself (world size 1) says so in a line of its own —
Hugging Face's ``torch.distributed process group is initialized, but parallel_mode !=
ParallelMode.DISTRIBUTED`` (each rank's ``TrainingArguments``), accelerate's ``Num processes:
1`` (its state, printed). ``Joins.alone`` counts those lines; when this node started several
processes (``several``) and two or more of them printed one, ``alone_note`` hands the
supervisor, once, ``2 processes each trained alone (world size 1): ...``: the job still ends as
it ends, with that as its reason (its metrics and outputs are one rank's, written by each).
The last poll after the job ended reads the rest of the log for it.
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
# one line per rank that runs with world size 1 (Hugging Face's warning; accelerate's printed state)
ALONE = (("parallel_mode != ParallelMode.DISTRIBUTED", "Hugging Face's 'parallel_mode != ParallelMode.DISTRIBUTED'"),
         ("Num processes: 1", "accelerate's 'Num processes: 1'"))
ALONE_LINE = re.compile(r"(?:parallel_mode != ParallelMode\.DISTRIBUTED|\bNum processes: 1\s*$)")


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
        self.alone: "dict[str, int]" = {}  # ALONE's words -> lines seen: ranks that said world size 1

    def line(self, text: str, now: float) -> None:
        if text.startswith(ORCH_LINE) or not text.strip():
            return
        if ALONE_LINE.search(text):
            words = ALONE[0][0] if ALONE[0][0] in text else ALONE[1][0]
            self.alone[words] = self.alone.get(words, 0) + 1
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

    def alone_reason(self) -> Optional[str]:
        """``N processes each trained alone (world size 1): ...`` once two or more ranks said
        so (the most any one marker was printed), else None."""
        words, count = max(self.alone.items(), key=lambda item: item[1], default=("", 0))
        if count < 2:
            return None
        said = dict(ALONE)[words]
        return ("%d processes each trained alone (world size 1): %s was printed %d times, so no process group "
                "joined them and each ran the whole training (metrics and outputs are one rank's, written by each); "
                "on a host without GPUs tell them to use the CPU (ACCELERATE_USE_CPU=true, --use_cpu, "
                "Accelerator(cpu=True)): docs/own-script.md" % (count, said, count))

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
                 wait_s: float = WAIT_S, several: bool = False,
                 alone_note: Callable[[str], None] = lambda _: None) -> None:
        self.log_path, self.say, self.note, self.wait_s = log_path, say, note, wait_s
        self.several, self.alone_note, self.alone_said = several, alone_note, False
        self.joins = Joins()
        try:
            self.offset = os.stat(log_path).st_size  # the job's lines come after what is there now
        except OSError:
            self.offset = 0
        self.tail = b""
        self.reason: Optional[str] = None
        self.duty = Duty("ranks joining", POLL_S, self.poll, say, last=self.last)

    def stop(self) -> None:
        """No note after this returns (a poll in progress, and the last read, are waited for)."""
        self.duty.stop(wait_s=STOP_WAIT_S)

    def _read(self, now: float) -> None:
        with open(self.log_path, "rb") as f:  # the supervisor's own log, there from its start
            f.seek(self.offset)
            data = f.read(MAX_READ)
        self.offset += len(data)
        lines = (self.tail + data).split(b"\n")
        self.tail = lines.pop()[-MAX_LINE:]
        for raw in lines:
            self.joins.line(raw.decode("utf-8", "replace"), now)
        alone = self.joins.alone_reason() if self.several and not self.alone_said else None
        if alone is not None:
            self.alone_said = True
            self.say(alone)
            self.alone_note(alone)

    def last(self) -> None:
        """After the job ended: the rest of the log (its last line too), for ranks that trained alone."""
        for _ in range(8):  # at most 8 MiB more
            before = self.offset
            self._read(time.time())
            if self.offset == before:
                break
        if self.tail:
            self.joins.line(self.tail.decode("utf-8", "replace"), time.time())
            self.tail = b""
            self._read(time.time())

    def poll(self) -> None:
        now = time.time()
        self._read(now)
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
          note: Callable[[Optional[str]], None], several: bool = False,
          alone_note: Callable[[str], None] = lambda _: None) -> Union[JoinWatch, _Off]:
    """A started ``JoinWatch`` of the node's log (``logs/node<N>.log``), its wait
    ``testhooks.join_wait_s`` of the host's root when the test harness set one; or, when it
    cannot start (said with ``say``), an object whose ``stop`` does nothing. ``several``: the
    node started more than one process (or one that may start its own): ranks that each
    trained alone go to ``alone_note``, once."""
    try:
        root = os.path.dirname(os.path.dirname(job_dir))
        wait_s = testhooks.join_wait_s(root) or WAIT_S
        watcher = JoinWatch(os.path.join(job_dir, "logs", "node%d.log" % node_rank), say, note, wait_s, several,
                            alone_note)
        watcher.duty.start()
        return watcher
    except Exception as exc:  # noqa: BLE001 - a hint in status, never a failed job
        say("ranks joining are not watched: %s" % describe(exc))
        return _Off()

"""``orch fetch JOB --watch``: keep the laptop's copy of a running job current.

A watch is a loop of *rounds*, one every ``interval`` seconds. A round connects to every node
of the job, runs the same fetch as ``orch fetch`` (same destination ``DEST/<job_id>/``, same
selection, plus ``checkpoints/`` unless told otherwise), prunes local checkpoint folders the
server no longer lists (unless ``keep_checkpoints``), and calls ``kit.keep`` with the
round's connections, recording where the kit lives (``state/kits.py``: ``orch resume --on``
finds it from any directory). Contracts:

* nothing half-made under a final name: single files keep fetch's ``.part`` + sha256 + rename
  rule; a checkpoint folder is completed in a hidden sibling and renamed into place whole
  (``verified.CheckpointFolders``);
* a failing round (``HostError``/``RemoteError``: a dropped link, a server asleep, the laptop
  just woken) never ends the watch: it is retried with a bounded backoff, and one
  "link lost … retrying" / "link back" pair is said per outage; a long pause between rounds
  (the laptop slept) is just a late round; a provider that cannot be asked is an outage too,
  but a provider box its provider says is off, released or failed ends the watch with its
  words and the way on (``jobs/nodes.py``: ``stopped_with_box``, exit 1);
* a round with nothing new moves no file data and reads no local file again (``verified.py``);
* the watch ends by itself after the first successful round that sees every node's job
  settled (``contract.protocol.SETTLED``): that round was the final fetch; the job's status is then
  asked once (and recorded), and is what ``run`` returns.

``alongside`` runs the rounds in a background thread while ``orch submit --follow`` streams
the log, then does the final fetch in the caller's thread. ``watch_to_end`` is the whole of
``orch fetch --watch`` without a terminal: what it says goes through its callbacks.
``watch_new_job`` is ``orch submit --watch``'s: a new job reported (and followed, the watch
alongside) by a callback, watched to its end, its provider hosts powered off after a followed
one ended (``on_finish.power_off``; never after Ctrl-C: the job runs on).
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from orchestrator.access.connect import open_transport
from orchestrator.access.power import power_off_after
from orchestrator.access.provisioned import InstanceDown
from orchestrator.display.progress import duration
from orchestrator.errors import HostError, OrchError, RemoteError
from orchestrator.fetch import DEFAULT_INTERVAL_S, kit, unfetched
from orchestrator.fetch.download import FetchSummary, fetch, nothing_selected, unwritable_error
from orchestrator.fetch.verified import GONE, HIDDEN, FetchState, remove_folder
from orchestrator.helper.remote import Remote
from orchestrator.hosts.inventory import Inventory
from orchestrator.jobs.nodes import aggregate, nodes_of, stopped_with_box
from orchestrator.providers.api import ProviderAuthError, ProviderUnreachable
from orchestrator.state import kits
from orchestrator.state.registry import JobRecord, Registry
from orchestrator.termtext import final_line
from orchestrator.transport.base import never
from remote_payload.contract.protocol import SETTLED

if TYPE_CHECKING:
    from orchestrator.spec.load import LoadedSpec

QUIET_BELOW_MB = 1.0  # a round moving less (a log's and the metrics' new lines) is not announced
INTERRUPTED = 130  # the exit code of an interrupted follow: the job keeps running
SMALL_ROUND = re.compile(r"^fetching \d+ file\(s\), ([0-9.]+) MB from ")
MAX_RETRY_S = 120.0  # a failing round is retried at least this often (and at most twice the interval apart)


def prune(dest: Path, listed: dict[str, set[str]]) -> list[str]:
    """Mirror the server's checkpoint retention in ``dest``: under each checkpoints folder the
    server lists ``step-*`` folders in (``listed``: folder -> step names), remove a local
    ``step-<N>`` it does not list that is older than the newest it lists, and any hidden
    ``.part-step-<N>`` it does not list (and ``.gone-*`` leftovers). Never the newest, never anything under a folder the
    server lists no checkpoint in. Returns the removed folders (names under ``dest``)."""
    removed: list[str] = []
    state = FetchState(dest)
    for parent, steps in listed.items():
        newest = max(int(s[5:]) for s in steps)
        try:
            present = [p for p in (dest / parent).iterdir() if p.is_dir() and not p.is_symlink()]
        except OSError:
            continue
        for path in present:
            if path.name.startswith(GONE):
                shutil.rmtree(path, ignore_errors=True)  # left by a removal that was cut short
                continue
            hidden = path.name.startswith(HIDDEN)
            step = path.name[len(HIDDEN):] if hidden else path.name
            if not (step.startswith("step-") and step[5:].isdigit()) or step in steps:
                continue
            if hidden or int(step[5:]) < newest:
                remove_folder(path)
                state.forget(f"{parent}/{path.name}")
                if not hidden:
                    removed.append(f"{parent}/{path.name}")
    state.save()
    return removed


class Backoff:
    """Delays between retries of a failing round: from ``min(interval, 1)`` s doubling up to
    ``min(2 × interval, MAX_RETRY_S)`` (never under the first delay)."""

    def __init__(self, interval: float) -> None:
        self.first = min(interval, 1.0)
        self.cap = max(min(2 * interval, MAX_RETRY_S), self.first)
        self.delay = self.first

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        self.delay = self.first


@dataclass
class Watch:
    """One job's watch (see the module docstring). ``extra``/``everything`` as for ``fetch``."""

    record: JobRecord
    inventory: Inventory
    registry: Registry
    dest_parent: Path
    say: Callable[[str], None]
    extra: list[str] = field(default_factory=list)
    everything: bool = False
    interval: float = DEFAULT_INTERVAL_S
    keep_checkpoints: bool = False
    fetched: int = 0          # files fetched by every round so far
    bytes: int = 0
    last: FetchSummary | None = None
    outage: float | None = None  # when the current outage began (time.time()), None while rounds succeed

    def round(self) -> dict[str, Any] | None:
        """One round (raises ``HostError``/``RemoteError`` like a fetch). Returns the job's
        status when every node's job has settled — this round was then the final fetch.
        The job's record is read again each round: a job moved meanwhile (``orch resume
        --on``) is watched where it lives now, never on the host it left."""
        self.record = self.registry.get(self.record.job_id)
        hosts = nodes_of(self.record, self.inventory)
        with ExitStack() as stack:
            remotes = [Remote(h, stack.enter_context(open_transport(h, self.inventory, never))) for h in hosts]
            if self.outage is not None:  # connected again
                self.say(f"link back after {duration(time.time() - self.outage)}")
                self.outage = None
            summary = fetch(self.record, self.inventory, self.dest_parent, self._fetch_say, extra=self.extra,
                            everything=self.everything, remotes=remotes, tell=False)
            self.last = summary
            self.fetched, self.bytes = self.fetched + len(summary.fetched), self.bytes + summary.bytes
            for folder in summary.committed:
                self.say(f"new checkpoint {folder}")
            if not self.keep_checkpoints:
                for folder in prune(summary.dest, summary.checkpoints):
                    self.say(f"removed {folder}: the server no longer keeps it (--keep-checkpoints keeps all)")
            settled = bool(summary.states) and all(s in SETTLED for s in summary.states)
            status = self._status(remotes) if settled else None
            # where the kit lives, recorded before it is written: once its move.json exists, a move
            # run from any folder finds it, whenever this watch is stopped
            kits.record(self.registry.path, self.record.job_id, summary.dest)
            kit.keep(remotes, self.record.job_id, summary.dest, self.say)
            if summary.ended and not summary.unwritable:  # a file this laptop cannot hold is not here
                self._tell(remotes, summary.dest)
        return status

    def _status(self, remotes: list[Remote]) -> dict[str, Any]:
        """The job's status from every node on this round's connections, recorded."""
        job_id, per_node = self.record.job_id, []
        for remote in remotes:
            jobs = remote.call("status", jobs=[job_id])["jobs"]
            if job_id not in jobs:
                raise RemoteError(f"{remote.host.name}: the status reply leaves out {job_id}")
            per_node.append(jobs[job_id])
        status = aggregate(per_node)
        self.registry.update(job_id, status["state"], status)
        return status

    def _tell(self, remotes: list[Remote], dest: Path) -> None:
        """Tell each node the outputs are here (``fetched``: lets ``on_finish.shutdown`` go
        ahead) — after the move kit is current, so a node that powers off has nothing left."""
        state = FetchState(dest)
        for remote in remotes:
            if remote.host.name not in state.told:
                remote.call("fetched", job=self.record.job_id)
                state.tell(remote.host.name)
        state.save()

    def attempt(self) -> dict[str, Any] | None:
        """``round``, with a failure counted as (part of) an outage instead of raised — a
        provider that cannot be asked too. A box its provider says is off, released or failed
        (``InstanceDown``) ends the watch: ``stopped_with_box`` (the recorded end of a job that
        ended first, returned as settled; else ``StoppedWithBox``, exit 1)."""
        try:
            status = self.round()
        except InstanceDown as down:
            return stopped_with_box(down, self.record, self.registry, self.inventory)
        except (HostError, RemoteError, ProviderUnreachable, ProviderAuthError) as exc:
            if self.outage is None:
                self.outage = time.time()
                self.say(f"link lost ({str(exc).splitlines()[0]}); retrying (Ctrl-C stops watching; "
                         "the job keeps running)")
            return None
        return status

    def _fetch_say(self, message: str) -> None:
        """``fetch``'s progress lines, less the small "fetching" ones every round has while
        the job writes its log and metrics."""
        small = SMALL_ROUND.match(message)
        if small is None or float(small[1]) >= QUIET_BELOW_MB:
            self.say(message)

    def run(self, stop: threading.Event | None = None) -> dict[str, Any] | None:
        """Rounds until the job has settled (returns its status) or ``stop`` is set between
        rounds (returns None)."""
        stop = stop or threading.Event()
        retry = Backoff(self.interval)
        while True:
            status = self.attempt()
            if status is not None:
                return status
            if self.outage is None:
                retry.reset()
            if stop.wait(self.interval if self.outage is None else retry.next()):
                return None

    def describe(self) -> str:
        """What the watch moved, one line (like ``orch fetch``'s)."""
        dest = self.last.dest if self.last else self.dest_parent / self.record.job_id
        there = len(self.last.unchanged) if self.last else 0
        return f"{dest}: {self.fetched} fetched while watching ({self.bytes / 2**20:.1f} MB), {there} already there"

    def nothing_note(self) -> str | None:
        """``fetch.nothing_selected``'s explanation when the watch ended with nothing selected."""
        last = self.last
        if last is None or last.fetched or last.unchanged or self.fetched:
            return None
        return nothing_selected(last, self.record.job_id)

    def unfetched_lines(self) -> list[str]:
        """What the job wrote that the last round's patterns did not select (``unfetched.lines``)."""
        if self.last is None:
            return []
        return unfetched.lines(unfetched.unfetched(self.last.unselected, self.last.here), self.record.job_id)

    @contextmanager
    def alongside(self) -> Iterator[None]:
        """Rounds in a background thread while the body runs (``orch submit --follow
        --watch``); when the body ends — normally or with ``SystemExit`` other than 130 (an
        interrupted follow) — the thread stops after its round and the final fetch runs here
        (``run`` until the job has settled). An error that ended the thread (a laptop disk
        that is full) is raised then."""
        stop, errors = threading.Event(), []

        def loop() -> None:
            try:
                self.run(stop)
            except OrchError as exc:
                errors.append(exc)

        thread = threading.Thread(target=loop, name="orch-watch", daemon=True)
        thread.start()
        try:
            yield
        except SystemExit as exc:
            stop.set()
            if exc.code != 130:
                self._final(thread, errors)
            raise
        except BaseException:
            stop.set()
            raise
        stop.set()
        self._final(thread, errors)

    def _final(self, thread: threading.Thread, errors: list[OrchError]) -> None:
        thread.join()
        if errors:
            raise errors[0]
        self.run()
        for line in self.unfetched_lines():
            self.say(line)
        self.say(self.describe())


def watch_to_end(record: JobRecord, inventory: Inventory, registry: Registry, dest: Path, *,
                 say: Callable[[str], None], echo: Callable[[str], None], extra: list[str] | None = None,
                 everything: bool = False, interval: float = DEFAULT_INTERVAL_S, keep_checkpoints: bool = False,
                 ended: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Watch ``record`` into ``dest/<job_id>/`` until the job ends and return its final
    status. ``say`` gets where it watches, each round's news, what the job wrote that no
    pattern selected (or why nothing was) and the job's end line; ``echo`` the one summary
    line (``describe``). ``ended(job_id, status)`` is called once the job ended, before a
    ``LocalFileError`` (exit 2) naming files this laptop cannot hold under their names (the
    rest is fetched). Ctrl-C stops the watch, never the job: ``StoppedWatching`` (a
    ``KeyboardInterrupt``) tells the caller."""
    watch = Watch(record, inventory, registry, dest, say, extra=list(extra or []), everything=everything,
                  interval=interval, keep_checkpoints=keep_checkpoints)
    try:
        say(f"watching {record.job_id} every {interval:g} s into {dest / record.job_id}"
            + ("" if keep_checkpoints else " (checkpoints the server deletes are removed here too)"))
        status = watch.run()
        assert status is not None  # run() without a stop event returns only when the job has settled
        note = watch.nothing_note()
        if note:
            say(note)
        for line in watch.unfetched_lines() if not note else []:
            say(line)
        echo(watch.describe())
        say(final_line(record.job_id, status))
        if ended is not None:
            ended(record.job_id, status)
    except KeyboardInterrupt:
        raise StoppedWatching(record.job_id) from None
    if watch.last is not None and watch.last.unwritable:
        raise unwritable_error(watch.last)
    return status


class StoppedWatching(KeyboardInterrupt):
    """Ctrl-C stopped a watch (``watch_to_end``); the job ``job_id`` keeps running. A
    ``KeyboardInterrupt``, so no ``except Exception`` swallows it."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id


def watch_new_job(job_id: str, loaded: LoadedSpec, inventory: Inventory, registry: Registry, dest: Path, *,
                  follow: bool, report: Callable[[bool], None], say: Callable[[str], None],
                  echo: Callable[[str], None], interval: float = DEFAULT_INTERVAL_S, keep_checkpoints: bool = False,
                  ended: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any] | None:
    """``orch submit --watch``: the job just submitted (``loaded`` its job file) watched into
    ``dest/<job_id>/``, its checkpoints included, until it ends. ``report(follow)`` is the
    caller's end of a submit: it says the new job and, with ``follow``, first follows its log
    to the end; it may raise ``SystemExit`` (a followed job that did not succeed; 130, an
    interrupted follow).

    With ``follow``: the watch's rounds run in a background thread while ``report(True)``
    runs, then the final fetch here (``Watch.alongside``; none after a 130), then the job's
    provider hosts are powered off when its file says ``on_finish.power_off``
    (``power_off_after``) — also when ``report`` raised ``SystemExit`` for a job that ended
    unsucceeded, raised again after; never after an interrupted follow (``SystemExit(130)``,
    Ctrl-C: the job runs on, so its hosts stay on). Returns None: ``report`` said how the job
    ended.

    Without: ``report(False)``, then the whole watch in this thread (``watch_to_end``; ``say``,
    ``echo`` and ``ended`` as there, ``StoppedWatching`` on Ctrl-C). Returns the job's final
    status; nothing is powered off."""
    if not follow:
        report(False)
        return watch_to_end(registry.get(job_id), inventory, registry, dest, say=say, echo=echo,
                            extra=["checkpoints/"], interval=interval, keep_checkpoints=keep_checkpoints, ended=ended)
    watcher = Watch(registry.get(job_id), inventory, registry, dest, say, extra=["checkpoints/"], interval=interval,
                    keep_checkpoints=keep_checkpoints)
    try:
        with watcher.alongside():
            report(True)
    except SystemExit as exc:
        if exc.code != INTERRUPTED:  # a followed job that did not succeed: powered off all the same
            power_off_after(inventory, loaded, say)
        raise  # an interrupted follow (130): the job runs on, and so does its box
    power_off_after(inventory, loaded, say)
    return None

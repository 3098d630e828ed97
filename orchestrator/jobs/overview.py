"""What ``orch status`` knows of a job, as data: its status (asked of its hosts while it is not
finished) and its row's fields (``display.progress.JobProgress``), for the command's table,
its ``--json`` and the Python API alike.

Finished jobs cost nothing: a job recorded as terminal (``registry.TERMINAL``) is never asked
about again, and its row is the final row recorded when a status first saw it terminal
(``Registry.record_final``; made then from the recorded status, the spec's step total and the
host's price). When every job asked about is such a job, ``refresh`` connects to no host and
loads neither the job/host modules (pydantic, paramiko) nor rich.
"""

from __future__ import annotations

from dataclasses import asdict
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable

from orchestrator.errors import OrchError, UsageError
from orchestrator.state import fences
from orchestrator.state.registry import TERMINAL, JobRecord, Registry

if TYPE_CHECKING:
    from orchestrator.display.progress import JobProgress
    from orchestrator.hosts.inventory import Inventory
    from orchestrator.providers.accounts import DailyCheck

_FINAL: dict[tuple[str, str], JobProgress] = {}  # (job id, state) -> final row made by this process


def refresh(records: list[JobRecord], inventory: Callable[[], Inventory], registry: Registry,
            say: Callable[[str], None], watch_billing: bool = False) -> dict[str, dict[str, Any]]:
    """Each job's status: the record's own for terminal jobs; unfinished ones from their hosts
    (one connection per host; nodes aggregated: ``jobs/nodes.refresh``, imported only then, or
    when a listed job has a superseded attempt still to stop, ``state/fences.py``). A provider
    that refuses or does not answer marks only its hosts' jobs (``nodes.refresh``), never
    raises. ``inventory``: called only when a host is asked.

    ``watch_billing`` (``orch status``): the provider accounts of the hosts being asked are
    also listed, in a thread beside those contacts, at most once an hour each, and an instance
    they hold that no host entry names and that bills is said once a day
    (``providers/accounts.py``: ``DailyCheck``)."""
    if all(r.state in TERMINAL for r in records) and not fences.pending(registry.path,
                                                                         job_ids=[r.job_id for r in records]):
        return {r.job_id: r.status() for r in records}
    from orchestrator.jobs import nodes

    hosts = inventory()
    check = _billing_check(records, hosts) if watch_billing else None
    statuses = nodes.refresh(records, hosts, registry, say)
    for line in check.warnings() if check is not None else []:
        say(line)
    return statuses


def _billing_check(records: list[JobRecord], inventory: Inventory) -> DailyCheck | None:
    """The daily look for unknown billing instances, started, over the accounts of the
    provider hosts of ``records``' unfinished jobs (None when there are none)."""
    asked = []
    for name in sorted({name for r in records if r.state not in TERMINAL for name in r.hosts}):
        try:
            asked.append(inventory.get(name))
        except OrchError:
            continue  # nodes.refresh says why
    if not any(h.provider is not None for h in asked):
        return None
    from orchestrator.providers.accounts import DailyCheck, accounts_of

    return DailyCheck(inventory.home, accounts_of(asked), lambda: inventory.survey()[0]).start()


@lru_cache(maxsize=256)
def _total_steps(spec_path: str) -> int | None:
    """``train.max_steps`` from the job's spec file, when it is still there and readable
    (read once per process: ``status -w`` refreshes often)."""
    from orchestrator.spec.load import load_spec

    try:
        train = load_spec(spec_path).spec.train
    except (OrchError, OSError):
        return None
    return train.max_steps if train is not None else None


def _price(inventory: Inventory, record: JobRecord) -> float | None:
    prices = []
    for name in record.hosts:
        try:
            prices.append(inventory.get(name).price_per_hour)
        except UsageError:
            return None
    return None if any(p is None for p in prices) else sum(prices) / max(len(prices), 1)


def _with_place(status: dict[str, Any]) -> dict[str, Any]:
    """A queued job's state shown with its place in its host's GPU queue: ``queued #2``."""
    place = status.get("queue_position")
    if status.get("state") == "queued" and type(place) is int:
        return dict(status, state=f"queued #{place}")
    return status


def progress_of(record: JobRecord, status: dict[str, Any], inventory: Callable[[], Inventory],
                registry: Registry) -> JobProgress:
    """The row's columns. A terminal job's are its recorded final row; the first time a
    terminal status is seen they are made (spec and inventory read) and recorded."""
    from orchestrator.display.progress import JobProgress, row_fields

    state = status.get("state")
    terminal = state in TERMINAL and not status.get("stale")
    if terminal:
        recorded = JobProgress.from_dict(record.final) if record.state == state else None
        recorded = recorded or _FINAL.get((record.job_id, str(state)))
        if recorded is not None:
            return recorded
    nodes = status.get("nodes")
    count = len(nodes) if isinstance(nodes, (list, dict)) and nodes else len(record.hosts)
    if len(record.hosts) == 1 and isinstance(status.get("log_nodes"), int) and 0 < status["log_nodes"] <= 10_000:
        count = status["log_nodes"]  # a Slurm job: the nodes of its allocation
    progress = row_fields(_with_place(status), record.created, count, _total_steps(record.spec_path),
                          _price(inventory(), record))
    if terminal:
        registry.record_final(record.job_id, str(state), asdict(progress))
        _FINAL[(record.job_id, str(state))] = progress
    return progress


def status_json(record: JobRecord, status: dict[str, Any], progress: JobProgress) -> dict[str, Any]:
    """One job as ``orch status JOB --json`` prints it: its status with its hosts, job folder,
    name and row (``progress``)."""
    return dict(status, hosts=record.hosts, job_dir=record.job_dir, name=record.name, progress=asdict(progress))

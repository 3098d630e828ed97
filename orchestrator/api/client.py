"""``Orch``: orch as a library — submit, status, logs, wait, fetch, cancel, resume, hosts, spend.

The calls are the ones the commands make (the same submit sequence, follow, fetch and
cancel), with results as frozen records (``results.py``: the fields ``--json`` prints) and
failures raised as the ``OrchError`` subclasses whose messages the CLI prints
(``orchestrator.errors``: ``UsageError``/``SpecError`` for bad input, ``HostError`` for a host
that cannot be reached, ``RemoteError`` for a step on the host that failed). Nothing here
prints: orch's progress lines go to ``say`` (default: dropped), and no question is asked
(a provider host that is off is powered on only with ``yes=True``; an unknown host key is
refused, as without a terminal). Importing this module loads neither click nor rich.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence, Union

from orchestrator import settings
from orchestrator.api.results import FetchResult, HostInfo, Job, JobStatus
from orchestrator.errors import SweepIncomplete, UsageError
from orchestrator.state.registry import JobRecord, Registry
from orchestrator.transport.base import never
from remote_payload.contract.protocol import GRACE_S

JobSource = Union[str, "os.PathLike[str]", Mapping[str, Any]]
POLL_S = 2.0


def _quiet(_: str) -> None:
    """The default ``say``: orch's progress lines are dropped."""


class _Stopped(BaseException):
    """Raised into a log reader whose consumer stopped iterating."""


class Orch:
    """One ``ORCH_HOME`` (``home``; default: the environment's, as the CLI's) and where orch's
    progress lines go (``say``). Every method opens what it needs and closes it before it
    returns (``logs`` when its iterator ends or is closed). The ``ORCH_*`` settings are read
    from ``os.environ`` when used (docs/configuration.md); one that cannot be read raises
    ``SettingError`` here, as ``orch`` exits 2 before a command."""

    def __init__(self, home: str | os.PathLike[str] | None = None, say: Callable[[str], None] = _quiet) -> None:
        settings.check_all()
        self.home = Path(home) if home is not None else None
        self.say = say
        self._inventory: Any = None
        self._registry: Registry | None = None

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self._registry = Registry(self.home)
        return self._registry

    @property
    def inventory(self) -> Any:
        """The host inventory (``hosts/inventory.Inventory``), opened on first use."""
        if self._inventory is None:
            from orchestrator.hosts.inventory import Inventory

            self._inventory = Inventory(self.home)
        return self._inventory

    def _record(self, job: str | Job | JobStatus) -> JobRecord:
        return self.registry.get(job if isinstance(job, str) else job.job_id)

    # -- submit --------------------------------------------------------------------------

    def submit(self, job: JobSource, *, hosts: Sequence[str] | None = None,
               sweep: Mapping[str, Sequence[Any]] | None = None, sweep_name: str | None = None,
               only: str | None = None, yes: bool = False, force: bool = False,
               pull_remote_edits: bool = False) -> Job | list[Job]:
        """Submit a job file (a path), or a job given as a mapping (the job file's fields; its
        ``workspace.path`` relative to the current directory). ``sweep``: ``{key: values}``
        as ``--sweep key=v1,v2`` (with the file's ``sweep:`` block, a sweep: a list of ``Job``,
        ``SweepIncomplete`` when some combinations did not start); ``hosts``: a sweep's pool
        (``--hosts``), or for one job the hosts it runs on instead of the file's ``hosts:``.
        ``yes``: power on a provider host that is off (else ``UsageError``); when the submit
        then fails before a job started there (its error raised as it is), each host it powered
        on is powered back off, said through ``say`` (``access.power.PoweredHere``: a host where
        a job may have started stays on)."""
        from orchestrator.access.power import PoweredHere, power_on_first
        from orchestrator.sweep.expand import axes_of

        loaded = self._load(job)
        flags = [f"{key}={','.join(_spelled(v) for v in values)}" for key, values in (sweep or {}).items()]
        axes = axes_of(loaded, flags)
        if hosts is not None and not axes:
            loaded = self._on_hosts(loaded, list(hosts))
        with PoweredHere(self.registry, ask=lambda _: None, say=self.say) as here:
            power_on_first(self.inventory, loaded, loaded.path, yes=yes, confirm=lambda _: None, say=self.say,
                           powered=here)
            if axes:
                jobs = self._submit_sweep(loaded, axes, sweep_name, only, hosts, force, pull_remote_edits)
                here.finish()  # its combinations may all have gone to other hosts
                return jobs
            if sweep_name is not None or only is not None:
                raise UsageError("sweep_name and only choose a sweep's combinations: give sweep= or a sweep: block")
            from orchestrator.jobs.submit import checked_submit

            done = checked_submit(loaded, self.inventory, self.registry, say=self.say, force=force,
                                  pull_remote_edits=pull_remote_edits, trust=never)
        data = done.as_json()
        return Job(data["job_id"], tuple(data["hosts"]), data["job_dir"], "pending", data=data)

    def _submit_sweep(self, loaded: Any, axes: list[Any], name: str | None, only: str | None,
                      hosts: Sequence[str] | None, force: bool, pull_remote_edits: bool) -> list[Job]:
        from orchestrator.sweep.launch import json_rows, missed_report, prepare, submit_sweep

        ready = prepare(loaded, axes, [], self.inventory, self.registry, name=name, only=only,
                        hosts=",".join(hosts) if hosts is not None else None, say=self.say)
        done = submit_sweep(ready.name, ready.combos, self.inventory, self.registry, say=self.say, only=ready.only,
                            force=force, pull_remote_edits=pull_remote_edits, trust=never)
        rows = json_rows(done)
        jobs = [Job(r["job_id"], (r["host"],), r["job_dir"], r["state"], r["sweep"], r["combination"], r["values"],
                    r["skipped"], r) for r in rows if r["state"] != "not-started"]
        if done.missed:
            raise SweepIncomplete(missed_report(done, ["orch", "submit", str(loaded.path), "--sweep-name", ready.name],
                                                ready.pool), done.exit_code())
        return jobs

    def _load(self, job: JobSource) -> Any:
        from orchestrator.spec.load import load_spec, parse_spec

        if isinstance(job, Mapping):
            import yaml

            name = str(job.get("name") or "job")
            return parse_spec(yaml.safe_dump(dict(job), sort_keys=False), Path.cwd() / f"{name}.yaml")
        return load_spec(Path(job))

    def _on_hosts(self, loaded: Any, hosts: list[str]) -> Any:
        """``loaded`` with ``hosts:`` replaced (its recorded text says so)."""
        from orchestrator.spec.load import parse_spec, parse_yaml

        import yaml

        data, _ = parse_yaml(loaded.text, str(loaded.path))
        data["hosts"] = hosts
        text = f"# submitted through orchestrator.api with hosts={hosts}\n" + yaml.safe_dump(data, sort_keys=False)
        return parse_spec(text, loaded.path)

    # -- status, wait, logs ----------------------------------------------------------------

    def status(self, job: str | Job | None = None) -> JobStatus | list[JobStatus]:
        """One job's status (asked of its hosts while it is not finished), or every job's:
        ``orch status JOB --json`` / ``orch status --json``."""
        from orchestrator.jobs import overview

        records = [self._record(job)] if job is not None else self.registry.all()
        statuses = overview.refresh(records, lambda: self.inventory, self.registry, self.say)
        found = [JobStatus.from_json(overview.status_json(
            r, statuses[r.job_id], overview.progress_of(r, statuses[r.job_id], lambda: self.inventory, self.registry)))
            for r in records]
        return found[0] if job is not None else found

    def wait(self, job: str | Job, timeout: float | None = None, interval: float = POLL_S) -> JobStatus:
        """Wait until the job is finished and return its status (whatever the state: read
        ``succeeded``); ``TimeoutError`` when ``timeout`` seconds pass first. A host that does
        not answer for a while is asked again (its jobs are ``lost`` only after
        ``ORCH_LOST_AFTER_S``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status(job)
            assert isinstance(status, JobStatus)
            if status.finished:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{status.job_id} is still {status.state} after {timeout:g} s")
            time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))

    def logs(self, job: str | Job, follow: bool = False, node: int | None = None,
             tail: int | None = None) -> Iterator[str]:
        """The job's log, line by line (each without its newline); ``follow``: until the job
        ends, reconnecting like ``orch logs -f`` after a dropped link. Closing the iterator
        stops the reading."""
        from orchestrator.jobs.logs import stream_logs

        record = self._record(job)
        texts: queue.Queue[str | BaseException | None] = queue.Queue(maxsize=1024)
        stopped = threading.Event()

        def write(text: str) -> None:
            if stopped.is_set():
                raise _Stopped
            texts.put(text)

        def read() -> None:
            try:
                stream_logs(record, self.inventory, self.registry, write=write, say=self.say, node=node,
                            follow=follow, tail=tail)
            except _Stopped:
                return
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
                texts.put(exc)
                return
            texts.put(None)

        reader = threading.Thread(target=read, daemon=True, name="orch-api-logs")
        reader.start()
        pending = ""
        try:
            while True:
                item = texts.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                pending += item
                *lines, pending = pending.split("\n")
                yield from lines
            if pending:
                yield pending
        finally:
            stopped.set()
            while reader.is_alive():  # unblock a reader waiting on a full queue
                try:
                    texts.get_nowait()
                except queue.Empty:
                    reader.join(0.05)

    # -- fetch, cancel, resume ---------------------------------------------------------------

    def fetch(self, job: str | Job, dest: str | os.PathLike[str] | None = None, checkpoints: bool = False,
              include: Sequence[str] = (), everything: bool = False) -> FetchResult:
        """Download what the job's ``outputs`` select (plus ``checkpoints/`` and ``include``
        patterns; ``everything``: the whole job folder but the synced code) into
        ``dest/<job_id>/`` (default ``./runs``), each file verified by sha256; idempotent.
        ``LocalFileError`` names files this laptop cannot hold (the rest is fetched)."""
        from orchestrator.fetch import unfetched
        from orchestrator.fetch.download import fetch, unwritable_error

        record = self._record(job)
        extra = (["checkpoints/"] if checkpoints else []) + list(include)
        summary = fetch(record, self.inventory, Path(dest) if dest is not None else Path("runs"), self.say,
                        extra=extra, everything=everything)
        if summary.unwritable:
            raise unwritable_error(summary)
        left = unfetched.unfetched(summary.unselected, summary.here)
        return FetchResult(record.job_id, summary.dest, tuple(summary.fetched), tuple(summary.unchanged),
                           summary.bytes, tuple(summary.patterns), summary.ended,
                           tuple(unfetched.as_json(left)), tuple(summary.unwritable))

    def cancel(self, job: str | Job, grace: float = GRACE_S) -> JobStatus:
        """Stop the job on every node (SIGTERM, then SIGKILL after ``grace`` seconds; the
        built-in trainer checkpoints) and return its status after; an attempt it left on a
        host it moved from is stopped too when that host answers."""
        from orchestrator.jobs.nodes import cancel, settle_fences

        record = self._record(job)
        cancel(record, self.inventory, self.registry, grace)
        settle_fences([record.job_id], self.inventory, self.registry, self.say)
        status = self.status(record.job_id)
        assert isinstance(status, JobStatus)
        return status

    def resume(self, job: str | Job, on: Sequence[str] | None = None, force: bool = False,
               why: str | None = None) -> Job:
        """Relaunch a failed, lost or cancelled job from its latest complete checkpoint;
        ``on``: move it to these hosts first (one per node; ``orch resume --on``), ``why``
        recorded with the move in the job's history."""
        record = self._record(job)
        if on:
            from orchestrator.move.resume_on import move

            move(record, list(on), self.inventory, self.registry, runs=None, say=self.say, trust=never, direct=False,
                 force=force, why=why)
        else:
            from orchestrator.jobs.nodes import resume

            resume(record, self.inventory, self.registry)
        record = self.registry.get(record.job_id)
        data = {"job_id": record.job_id, "hosts": list(record.hosts), "job_dir": record.job_dir,
                "state": record.state}
        return Job(record.job_id, tuple(record.hosts), record.job_dir, record.state, data=data)

    # -- spend ---------------------------------------------------------------------------------

    def spend(self, month: str | None = None) -> Any:
        """What orch's jobs cost in ``month`` (``YYYY-MM``, default this one) per host and per
        provider, from this laptop's records, with each provider account's balance: a
        ``jobs.spend.Spend``, whose ``as_json()`` is ``orch spend --json``."""
        from orchestrator.jobs.spend import provider_balance, spend

        return spend(self.registry.all(), self.inventory, month, balance_of=provider_balance)

    # -- instances -----------------------------------------------------------------------------

    def instances(self, provider: str | None = None, token_env: str | None = None,
                  api_url: str | None = None) -> Any:
        """Every instance each provider account holds, as ``orch instances`` lists them: the
        accounts the host entries name, or the one ``provider`` names (its token in
        ``token_env``, default the provider's usual variable). A list of
        ``providers.accounts.Holding`` (one per account: its instances, each with the host entry
        naming it, ``unknown_billing`` and the commands; or its ``error`` and ``exit_code``,
        never raised), whose ``as_json()`` is an element of ``orch instances --json``."""
        from orchestrator.providers.accounts import accounts_for, list_accounts

        hosts, _ = self.inventory.survey()
        return list_accounts(accounts_for(hosts, provider, token_env, api_url), hosts)

    # -- tunnel --------------------------------------------------------------------------------

    def tunnel(self, target: str | Job, ports: Sequence[str | int] = (), local: Sequence[int] = (),
               bind: str = "127.0.0.1") -> Any:
        """``orch tunnel``: ports of a host or of a job's first node (``target``: a host name, a
        job id or a ``Job``; ``ports`` like the command's ``PORT`` words, default the job's
        ``launch.ports``) forwarded to ``local`` ports of this machine (default the same; 0 a
        free one) through orch's own connection, which is made again after a drop or a power
        cycle. Returns a running ``tunnel.listen.Tunnel`` (``urls``, ``lines()``; a context
        manager; ``close()`` ends it). ``UsageError`` for a taken local port or the ``local``
        host (its ports need no tunnel), ``HostError`` when the host cannot be reached."""
        from orchestrator.tunnel.start import forwards_for, open_tunnel
        from orchestrator.tunnel.target import resolve

        name = target.job_id if isinstance(target, Job) else target
        found = resolve(name, self.inventory, self.registry)
        return open_tunnel(found, forwards_for(found, [str(p) for p in ports], list(local)), self.inventory, bind,
                           self.say)

    # -- hosts ---------------------------------------------------------------------------------

    def hosts(self) -> list[HostInfo]:
        """Every host of the inventory, ``local`` first, as ``orch hosts ls --json`` lists
        them (a provider host's state and price asked of its provider now; a broken entry
        listed with why, never hiding the others)."""
        from orchestrator.access.provisioned import facts

        good, broken = self.inventory.survey()
        found = [HostInfo(h.name, h.target, h.root, bool(h.host_key),
                          facts(h) if h.provider is not None else None) for h in [self.inventory.local(), *good]]
        return found + [HostInfo(name, None, None, False, broken=str(error)) for name, error in broken.items()]


def _spelled(value: Any) -> str:
    """A sweep value as ``--sweep`` spells it (a YAML scalar)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    text = str(value)
    if "," in text:
        raise UsageError(f"sweep value {text!r}: a value may not hold a comma")
    return text


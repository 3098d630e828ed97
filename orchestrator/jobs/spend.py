"""What orch's jobs cost in a month, per host and per provider, and what each provider account
holds: ``orch spend`` and the Python API's ``Orch.spend``.

The sums come from this laptop alone — the registry's job records and the host entries — with
no connection to any host:

- a job's cost is what ``orch status``'s COST says: the price per hour times its nodes times
  its elapsed time (from its first attempt's start to its end, or to now while it is not
  finished as last recorded). A finished job's is its recorded final row (the price it was
  shown with when orch first saw it end); an unfinished one's uses its hosts' price now. A job
  with no known price (``local``, a host without ``--price-per-hour``) counts its hours and no
  cost;
- a month is the laptop's local calendar month; a job running across its edge counts the part
  of its time inside it (its cost in proportion);
- a multi-node job's cost is shared evenly by its hosts, and each counts the job's hours (each
  box ran them); jobs that shared a box at the same time each count their own, as
  ``orch status`` shows them;
- a job whose record is not finished counts until now: ``orch status`` brings its record up
  to date first (``unfinished`` says how many there are).

Balances are the one thing asked of a provider: ``Provider.balance()`` once per account orch
knows from its host entries (``providers/accounts.py``'s ``accounts_of``: provider, token
variable, API URL). A failure, a missing token or
a provider that reports none is one line (``Balance.note``), never an error of the command.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Callable

from orchestrator.display.progress import run_span
from orchestrator.errors import OrchError, UsageError
from orchestrator.hosts.inventory import Host, Inventory
from orchestrator.plan.budget import currency_of
from orchestrator.providers.accounts import Account, accounts_of
from orchestrator.state.registry import SUBMITTING, TERMINAL, JobRecord


@dataclass(frozen=True)
class HostSpend:
    """One host's month: its provider ("" for a plain host; ``?`` when its entry is gone), the
    currency of its price, its price per hour now (None: unknown), how many jobs ran on it,
    their hours and cost (None when no job of it had a known price)."""

    host: str
    provider: str
    currency: str
    price_per_hour: float | None
    jobs: int
    hours: float
    cost: float | None
    unpriced_jobs: int = 0  # jobs whose hours count but whose cost is unknown


@dataclass(frozen=True)
class ProviderSpend:
    """One provider's (and currency's) month over its hosts; provider "" for plain hosts."""

    provider: str
    currency: str
    cost: float
    hosts: list[str]


@dataclass(frozen=True)
class AccountBalance:
    """One provider account's balance: ``amount`` in ``currency``, or ``note`` saying why there
    is none (not reported, no token, the provider's error)."""

    provider: str
    token_env: str
    api_url: str | None
    amount: float | None
    currency: str
    note: str = ""


@dataclass(frozen=True)
class Spend:
    """``orch spend``'s answer for ``month`` (``YYYY-MM``)."""

    month: str
    hosts: list[HostSpend]
    providers: list[ProviderSpend]
    balances: list[AccountBalance]
    unfinished: int = 0  # jobs counted until now because their record is not finished
    jobs: list[str] = field(default_factory=list)  # the ids of the jobs counted

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def month_bounds(month: str | None, now: float | None = None) -> tuple[str, float, float]:
    """``(YYYY-MM, start, end)`` of ``month`` (default: this one) in the laptop's local time, as
    epoch seconds; ``UsageError`` for anything but ``YYYY-MM``."""
    now = time.time() if now is None else now
    text = month or datetime.fromtimestamp(now).strftime("%Y-%m")
    try:
        first = datetime.strptime(text, "%Y-%m")
    except ValueError:
        raise UsageError(f"--month {text!r}: give a month as YYYY-MM (e.g. 2026-12)") from None
    after = first.replace(year=first.year + 1, month=1) if first.month == 12 else first.replace(month=first.month + 1)
    return first.strftime("%Y-%m"), first.timestamp(), after.timestamp()


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _entry(inventory: Inventory, name: str) -> Host | None:
    try:
        return inventory.get(name)
    except OrchError:  # removed, or an entry that cannot be read: its jobs still count their hours
        return None


def _job_cost(record: JobRecord, hosts: list[Host | None], elapsed: float) -> float | None:
    """The job's whole cost as ``orch status`` shows it: its recorded final row's, else its
    hosts' price now (their mean, times its nodes) over ``elapsed``; None when unknown."""
    if record.final is not None and _num(record.final.get("cost")) is not None:
        return _num(record.final["cost"])
    prices = [h.price_per_hour if h is not None else None for h in hosts]
    if not prices or any(p is None for p in prices):
        return None
    return sum(p or 0.0 for p in prices) * elapsed / 3600  # the mean times the nodes


def spend(records: list[JobRecord], inventory: Inventory, month: str | None = None,
          balance_of: Callable[[Account], Any] | None = None, now: float | None = None) -> Spend:
    """The month's ``Spend`` of ``records`` (the registry's jobs), the sums as the module says.
    ``balance_of(account)``: the account's ``Balance`` or None (``provider_balance``; None: no
    balances asked). Reads no host."""
    now = time.time() if now is None else now
    label, start, end = month_bounds(month, now)
    rows: dict[str, dict[str, Any]] = {}
    counted: list[str] = []
    unfinished = 0
    for record in records:
        if record.state == SUBMITTING or not record.hosts:
            continue
        since, until = run_span(record.status(), record.created, now)  # as orch status counts it
        if not (since < end and until > start) and not start <= since < end:
            continue  # not in this month
        inside = max(min(until, end) - max(since, start), 0.0)
        counted.append(record.job_id)
        unfinished += record.state not in TERMINAL
        entries = [_entry(inventory, name) for name in record.hosts]
        elapsed = until - since
        cost = _job_cost(record, entries, elapsed)
        share = inside / elapsed if elapsed > 0 else 1.0
        for name, host in zip(record.hosts, entries):
            row = rows.setdefault(name, {"host": host, "jobs": 0, "hours": 0.0, "cost": None, "unpriced": 0})
            row["jobs"] += 1
            row["hours"] += inside / 3600
            if cost is None:
                row["unpriced"] += 1
            else:
                row["cost"] = (row["cost"] or 0.0) + cost * share / len(record.hosts)
    hosts = [_host_spend(name, row) for name, row in sorted(rows.items())]
    return Spend(month=label, hosts=hosts, providers=_by_provider(hosts),
                 balances=balances(inventory, balance_of) if balance_of is not None else [], unfinished=unfinished,
                 jobs=counted)


def _host_spend(name: str, row: dict[str, Any]) -> HostSpend:
    host: Host | None = row["host"]
    provider = "?" if host is None else host.provider.name if host.provider is not None else ""
    return HostSpend(host=name, provider=provider, currency=currency_of(host) if host is not None else "",
                     price_per_hour=host.price_per_hour if host is not None else None, jobs=row["jobs"],
                     hours=round(row["hours"], 6), cost=None if row["cost"] is None else round(row["cost"], 6),
                     unpriced_jobs=row["unpriced"])


def _by_provider(hosts: list[HostSpend]) -> list[ProviderSpend]:
    """Each (provider, currency)'s cost over its hosts with a known cost."""
    groups: dict[tuple[str, str], list[HostSpend]] = {}
    for row in hosts:
        if row.cost is not None:
            groups.setdefault((row.provider, row.currency), []).append(row)
    return [ProviderSpend(provider=p, currency=c, cost=round(sum(r.cost or 0.0 for r in rows), 6),
                          hosts=[r.host for r in rows]) for (p, c), rows in sorted(groups.items())]


def balances(inventory: Inventory, balance_of: Callable[[Account], Any]) -> list[AccountBalance]:
    """``balance_of`` for each account the usable host entries name (``accounts_of``), once;
    a failure or None is the account's ``note``."""
    out = []
    for account in accounts_of(inventory.survey()[0]):
        head = (account.provider, account.token_env, account.api_url)
        try:
            found = balance_of(account)
        except OrchError as exc:
            out.append(AccountBalance(*head, None, "", str(exc).splitlines()[0]))
            continue
        if found is None:
            out.append(AccountBalance(*head, None, "", f"{account.provider} reports no balance"))
        else:
            out.append(AccountBalance(*head, float(found.amount), str(found.currency)))
    return out


def provider_balance(account: Account) -> Any:
    """The account's ``Balance`` (or None), the provider opened with its token: ``balance_of``
    for ``spend`` (a provider without the call reports none: ``NotSupported`` is None too)."""
    from orchestrator.providers.api import NotSupported
    from orchestrator.providers.open import open_named

    try:
        return open_named(account.provider, account.token_env, account.api_url).balance()
    except NotSupported:
        return None

"""Every instance a provider account holds, set against the host entries: what ``orch
instances`` lists and what ``orch status`` warns about once a day.

An account is a provider with a token variable and an API URL (``Account``): the ones orch
knows of are those its provider host entries name, each once (``accounts_of``), or one a
command is given. ``list_accounts`` asks each for ``Provider.instances()`` at once (one thread
per account) and never stops for one account: a token that is missing or refused, an API that
does not answer, a provider whose adapter cannot list (``NotSupported``) is that account's
``error`` (with its exit code) while the others are listed. Each instance is matched to the
host entry that names it (same provider and instance id: ids are unique per provider) and
given the commands that add it, power it off and release it (``Commands``). An instance no
entry names, in a state that bills (``Instance.bills``), is *billing, unknown to orch*.

``DailyCheck`` is ``orch status``'s watch for such instances: only accounts whose hosts status
is contacting anyway, listed in a thread beside those contacts, each at most once per
``CHECK_EVERY_S`` and warned about at most once per ``WARN_EVERY_S``; the times are kept in
``ORCH_HOME/instances-check.json``. Nothing here prints; a failed listing there says nothing
(status already shows its provider's words on its hosts' rows).
"""

from __future__ import annotations

import json
import re
import shlex
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from orchestrator.errors import OrchError, UsageError
from orchestrator.home import write_private
from orchestrator.hosts.inventory import NAME_RE, Host
from orchestrator.providers.api import Instance, NotSupported
from orchestrator.providers.http import check_api_url
from orchestrator.providers.open import open_named
from orchestrator.providers.registry import PROVIDERS

CHECK_FILE = "instances-check.json"
CHECK_EVERY_S = 3600.0
WARN_EVERY_S = 86400.0


@dataclass(frozen=True, order=True)
class Account:
    """One provider account as orch reaches it: the provider, the token's variable, the API
    (None: the provider's own)."""

    provider: str
    token_env: str
    api_url: str | None = None

    @property
    def key(self) -> str:
        """``vast $VAST_API_KEY`` (``@ URL`` added for another API): how messages, the listing
        and the check file name it."""
        return f"{self.provider} ${self.token_env}" + (f" @ {self.api_url}" if self.api_url else "")

    def options(self) -> list[str]:
        """The options that name this account to ``orch hosts add``."""
        return ["--provider", self.provider, "--token-env", self.token_env] + (
            ["--api-url", self.api_url] if self.api_url else [])


@dataclass(frozen=True)
class Commands:
    """What to run for one instance: ``add`` (empty for a known one), ``power_off`` (empty for
    one that is off) and ``release`` (for an unknown one they start with adding it); ``console`` where a person can
    do the same by hand."""

    add: str
    power_off: str
    release: str
    console: str


@dataclass(frozen=True)
class Listed:
    """One instance of an account: ``host`` the entry naming it ("" when none does),
    ``billing`` whether its state bills, ``age_s`` since its creation (None when the
    provider does not say)."""

    instance: Instance
    host: str
    billing: bool
    age_s: float | None
    commands: Commands

    @property
    def unknown_billing(self) -> bool:
        """Billing, and no host entry names it."""
        return self.billing and not self.host

    def as_json(self) -> dict[str, Any]:
        found = self.instance
        return {"id": found.id, "state": found.state, "status": found.status, "label": found.label,
                "gpu": found.gpu, "price_per_hour": found.price_per_hour, "currency": found.currency,
                "created_at": found.created_at.isoformat() if found.created_at else None,
                "age_s": None if self.age_s is None else round(self.age_s), "host": self.host or None,
                "billing": self.billing, "unknown_billing": self.unknown_billing,
                "commands": {"add": self.commands.add or None, "power_off": self.commands.power_off or None,
                             "release": self.commands.release, "console": self.commands.console or None}}


@dataclass(frozen=True)
class Holding:
    """One account's answer: its instances, or ``error`` (one line, the provider's words) with
    ``exit_code``; ``not_supported`` when its adapter cannot list instances."""

    account: Account
    instances: tuple[Listed, ...] = ()
    error: str = ""
    exit_code: int = 0
    not_supported: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"provider": self.account.provider, "token_env": self.account.token_env,
                "api_url": self.account.api_url, "error": self.error or None, "exit_code": self.exit_code,
                "not_supported": self.not_supported, "instances": [i.as_json() for i in self.instances]}


def accounts_of(hosts: Iterable[Host]) -> list[Account]:
    """The accounts ``hosts``' provider entries name, each once, sorted."""
    return sorted({Account(h.provider.name, h.provider.token_env, h.provider.api_url)
                   for h in hosts if h.provider is not None})


def accounts_for(hosts: Iterable[Host], provider: str | None = None, token_env: str | None = None,
                 api_url: str | None = None) -> list[Account]:
    """The accounts to list: the one ``provider`` names (its token variable ``token_env``, else
    the provider's usual one; ``api_url`` checked as ``providers/http.py`` checks it), else every
    account ``hosts`` name. ``UsageError`` (exit 2) for ``token_env``/``api_url`` without
    ``provider``, an unknown provider or a URL no token may go to."""
    if provider is None:
        if token_env or api_url:
            raise UsageError("--token-env and --api-url go with --provider")
        return accounts_of(hosts)
    if provider not in PROVIDERS:
        raise UsageError(f"unknown provider {provider!r} (known: {', '.join(PROVIDERS)})")
    if api_url:
        check_api_url(api_url)
    return [Account(provider, token_env or PROVIDERS[provider].token_env, api_url)]


def _name_for(account: Account, found: Instance, taken: set[str]) -> str:
    """A host name for an unknown instance: its label where that is a valid, free name, else
    ``PROVIDER-ID`` made valid."""
    label = re.sub(r"[^a-z0-9-]+", "-", found.label.lower()).strip("-")[:40].strip("-")
    if label and re.match(NAME_RE, label) and label not in taken:
        return label
    made = re.sub(r"[^a-z0-9-]+", "-", f"{account.provider}-{found.id}".lower())[:40].strip("-")
    return made if re.match(NAME_RE, made) else account.provider


def commands_for(account: Account, found: Instance, host: str, name: str) -> Commands:
    """The commands for one instance: for a known one (``host``) ``orch down``/``orch release``
    of its entry; for an unknown one ``orch hosts add name`` first, with the provider's own
    preset where it has one (its root on such a box), and AutoDL releases only a powered-off
    instance, so its release powers off first. An instance that is off has no power-off."""
    adapter = PROVIDERS[account.provider].load()
    console = str(getattr(adapter, "console", "") or "")
    off = found.state == "off"
    if host:
        return Commands(add="", power_off="" if off else f"orch down {host}", release=f"orch release {host}",
                        console=console)
    presets = [word for preset in PROVIDERS[account.provider].presets for word in ("--preset", preset)]
    add = shlex.join(["orch", "hosts", "add", name, "--provider", account.provider, "--instance", found.id,
                      "--token-env", account.token_env] + (["--api-url", account.api_url] if account.api_url else [])
                     + presets)  # the id is the provider's text: quoted, so pasting it runs nothing else
    off_first = f"orch down {name} && " if adapter.release_needs_off and not off else ""
    return Commands(add=add, power_off="" if off else f"{add} && orch down {name}",
                    release=f"{add} && {off_first}orch release {name}", console=console)


def list_account(account: Account, hosts: list[Host], now: float | None = None) -> Holding:
    """``account``'s instances against ``hosts`` (every entry orch has); an error of the
    account is its ``Holding.error``, never raised."""
    now = time.time() if now is None else now
    try:
        found = open_named(account.provider, account.token_env, account.api_url).instances()
    except NotSupported as exc:
        return Holding(account, error=exc.message, exit_code=0, not_supported=True)
    except OrchError as exc:
        return Holding(account, error=str(exc).splitlines()[0], exit_code=exc.exit_code)
    named = {h.provider.instance: h.name for h in hosts
             if h.provider is not None and h.provider.name == account.provider}
    taken = {h.name for h in hosts}
    listed = []
    for instance in sorted(found, key=lambda i: i.id):
        if instance.state == "released":
            continue
        host = named.get(instance.id, "")
        name = "" if host else _name_for(account, instance, taken)
        taken.add(name)
        commands = commands_for(account, instance, host, name)
        age = now - instance.created_at.timestamp() if instance.created_at is not None else None
        listed.append(Listed(instance, host, instance.bills, age, commands))
    return Holding(account, tuple(listed))


def list_accounts(accounts: list[Account], hosts: list[Host]) -> list[Holding]:
    """``list_account`` for every account at once, in ``accounts``' order."""
    if len(accounts) <= 1:
        return [list_account(a, hosts) for a in accounts]
    with ThreadPoolExecutor(max_workers=min(len(accounts), 8)) as pool:
        return list(pool.map(lambda a: list_account(a, hosts), accounts))


def warning_for(account: Account, item: Listed) -> str:
    """The line ``orch status`` says of an unknown billing instance."""
    found = item.instance
    price = f", {found.price_per_hour:g} {found.currency}/h".rstrip() if found.price_per_hour is not None else ""
    return (f"warning: the {account.provider} account of ${account.token_env} holds instance {found.id} "
            f"({found.status or found.state}{price}), billing, unknown to orch: `orch instances` says how to "
            f"add it, power it off or release it (said once a day)")


@dataclass
class DailyCheck:
    """``orch status``'s look for unknown billing instances, run in a thread beside its host
    contacts: ``start`` lists the accounts that are due against ``hosts()`` (every entry, read
    in the thread), ``warnings`` waits for that listing (as long as its provider calls take,
    each bounded by ``ORCH_PROVIDER_TIMEOUT_S``) and returns one line per unknown billing instance of an account not warned about within
    ``WARN_EVERY_S``, recording the times."""

    home: Path
    accounts: list[Account]
    hosts: Callable[[], list[Host]]
    now: float = field(default_factory=time.time)
    _thread: threading.Thread | None = field(default=None, init=False)
    _found: list[Holding] = field(default_factory=list, init=False)

    @property
    def path(self) -> Path:
        return self.home / CHECK_FILE

    def _times(self) -> dict[str, dict[str, float]]:
        """The check file: account key -> ``checked``/``warned`` times (a damaged file: none)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: {t: float(v[t]) for t in ("checked", "warned") if isinstance(v.get(t), (int, float))}
                for k, v in data.items() if isinstance(k, str) and isinstance(v, dict)}

    def due(self) -> list[Account]:
        """The accounts not listed within ``CHECK_EVERY_S`` nor warned about within ``WARN_EVERY_S``."""
        times = self._times()
        return [a for a in self.accounts
                if self.now - times.get(a.key, {}).get("checked", 0.0) >= CHECK_EVERY_S
                and self.now - times.get(a.key, {}).get("warned", 0.0) >= WARN_EVERY_S]

    def start(self) -> DailyCheck:
        """Start listing the due accounts (nothing when none is due)."""
        due = self.due()
        if due:
            self._thread = threading.Thread(target=lambda: self._found.extend(list_accounts(due, self.hosts())),
                                            name="orch-instances-check", daemon=True)
            self._thread.start()
        return self

    def warnings(self) -> list[str]:
        """The lines to say (empty when nothing was due or found); the check file updated."""
        if self._thread is None:
            return []
        self._thread.join()
        times, lines = self._times(), []
        for holding in self._found:
            if holding.error:
                continue
            entry = times.setdefault(holding.account.key, {})
            entry["checked"] = self.now
            unknown = [i for i in holding.instances if i.unknown_billing]
            if unknown:
                entry["warned"] = self.now
                lines += [warning_for(holding.account, i) for i in unknown]
        try:
            write_private(self.path, json.dumps(times, indent=1, sort_keys=True) + "\n")
        except OSError:
            pass  # the warning comes again next time
        return lines


class AccountsFailed(OrchError):
    """Some accounts could not be listed (the others were; each failure's words are in the
    listing, its ``error``): the exit code is the first failed account's (2 its token variable unset, 3 its token refused or its API unreachable,
    4 a refusal by the provider)."""

    def __init__(self, failed: list[Holding], total: int) -> None:
        self.exit_code = failed[0].exit_code
        super().__init__(f"{len(failed)} of {total} provider accounts could not be listed: "
                         + ", ".join(h.account.key for h in failed) + " (the provider's words are in the listing)")


def raise_failures(holdings: list[Holding]) -> None:
    """``AccountsFailed`` when an account could not be listed (one that cannot list at all,
    ``not_supported``, is no failure)."""
    failed = [h for h in holdings if h.error and not h.not_supported]
    if failed:
        raise AccountsFailed(failed, len(holdings))

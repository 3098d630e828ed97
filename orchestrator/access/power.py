"""Provider hosts powered on and proven, around the commands that need them: the SSH login
that proves a box answers (``login``), the provider's price kept in the entry
(``remember_price``), a job's hosts that are off powered on before its submit after a yes
(``power_on_first``), powered back off when that submit then fails before a job started
there (``PoweredHere``), off after a watched job with ``on_finish.power_off``
(``power_off_after``), a running one made ready for the system ssh and VSCode
(``ready_for_system_ssh``), and what ``orch hosts check`` says of one before the checks on the
box (``instance_ready``).

Nothing here asks a person or prints: questions go through a ``confirm`` callback (None: no
one to ask), progress through ``say``. Without a yes nothing is powered on (billing starts).
The providers' code is imported only when a host has a provider (a plain submit loads none).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Callable

from orchestrator.access import keys
from orchestrator.access.connect import ask_on_tty, open_transport
from orchestrator.errors import UsageError
from orchestrator.hosts.sshconfig import remember_seen
from orchestrator.state.registry import SUBMITTING
from orchestrator.transport.base import never

if TYPE_CHECKING:
    from orchestrator.hosts.inventory import Host, Inventory
    from orchestrator.spec.load import LoadedSpec
    from orchestrator.state.registry import JobRecord, Registry


def login(inventory: Inventory, say: Callable[[str], None], trust: bool) -> Callable[[Host], None]:
    """An SSH login that runs ``true``: the proof that the box answers. A first host key is
    pinned in the entry with ``trust`` (its fingerprint said), else asked about on a terminal;
    never accepted silently. A pinned key that differs is refused (exit 3)."""
    def accept(fingerprint: str) -> bool:
        if trust:
            say(f"pinned host key {fingerprint}")
            return True
        return ask_on_tty(fingerprint)

    def run(live: Host) -> None:
        with open_transport(live, inventory, accept) as transport:
            transport.run(["true"], timeout=60)
    return run


def remember_price(inventory: Inventory, host: Host) -> None:
    """The price per hour the provider reports, kept in the entry so that `orch status`'s
    COST uses it (a price is no secret); nothing changes when it reports none."""
    from orchestrator.providers.open import provider_of

    assert host.provider is not None
    price = provider_of(host).instance(host.provider.instance).price_per_hour
    if price is not None and price != host.price_per_hour:
        inventory.save(inventory.get(host.name).model_copy(update={"price_per_hour": price}))


def provider_hosts(inventory: Inventory, loaded: LoadedSpec) -> list[Host]:
    """The job's hosts that are rented through a provider (inventory names only)."""
    return [h for h in (inventory.resolve(ref) for ref in loaded.spec.hosts) if h.provider is not None]


@dataclass(frozen=True)
class PowerOn:
    """What ``power_on_first`` found: ``go_on`` false only for a dry run that stops at the
    hosts it would power on, each in ``would_power_on`` as ``{host, provider, instance,
    state, price_per_hour, currency}``."""

    go_on: bool
    would_power_on: tuple[dict[str, object], ...] = ()


def power_on_first(inventory: Inventory, loaded: LoadedSpec, spec_file: Path, *, yes: bool,
                   confirm: Callable[[str], bool | None], say: Callable[[str], None],
                   dry_run: bool = False, powered: PoweredHere | None = None) -> PowerOn:
    """Power on every provider host of the job that is off, each after ``yes`` or a yes from
    ``confirm(question)``, and wait until SSH answers. ``UsageError`` (exit 2) when the answer
    is no, or None (no one to ask: the message gives the command with ``--yes``); nothing is
    submitted then. A dry run powers nothing on: it says what it would and returns
    ``go_on=False`` with those hosts (the plan needs the box on: it asks the host's helper
    for its facts). A job without provider hosts loads no provider code. ``powered``: each
    host is added to it right before its power-on, so that a failure from then on (this
    host's SSH wait, a moved host key, the next host refused, the submit itself) powers it
    back off when no job started there (``PoweredHere``)."""
    hosts = provider_hosts(inventory, loaded)
    if not hosts:
        return PowerOn(True)
    from orchestrator.access.provisioned import bring_up, describe
    from orchestrator.providers.open import provider_of

    off: list[tuple[Host, str]] = []
    rows: list[dict[str, object]] = []
    for host in hosts:
        assert host.provider is not None
        provider = provider_of(host)
        state, _ = provider.state(host.provider.instance)
        if state != "running":
            found = provider.instance(host.provider.instance)
            off.append((host, f"{provider.name} instance {host.provider.instance}, {describe(found)}"))
            rows.append({"host": host.name, "provider": provider.name, "instance": found.id, "state": found.status,
                         "price_per_hour": found.price_per_hour, "currency": found.currency})
    if not off:
        return PowerOn(True)
    if dry_run:
        for host, what in off:
            say(f"would power on {host.name} ({what}); the plan is shown once it is on")
        return PowerOn(False, tuple(rows))
    for host, what in off:
        answer = yes or confirm(f"{host.name} is off ({what}). Power it on (billing starts)?")
        if answer is None:
            raise UsageError(f"{host.name} is off ({what}); to power it on and submit: "
                             f"orch submit {shlex.quote(str(spec_file))} --yes (or first: orch up {host.name})")
        if not answer:
            raise UsageError(f"{host.name} is off and stays off: nothing was submitted")
        if powered is not None:
            powered.add(host)
        bring_up(host, say, login(inventory, say, trust=False))
        remember_price(inventory, host)
    return PowerOn(True)


class PoweredHere:
    """The provider hosts this command powered on for its submit (``power_on_first`` adds
    each), powered back off when the submit fails before a job started on them: nothing left
    billing by orch's own failure.

    A context manager, entered around the power-on and around the submit (more than once is
    fine). When an exception (an ``OrchError``, ``SweepIncomplete``, Ctrl-C) leaves it, each
    host added is judged by the job records this command added or changed on it since the
    first power-on (``started``; a record that existed then counts only if it was a
    reservation: an older job's state refreshed meanwhile is not this submit's):

    * a job there that is no longer a reservation started: the host stays on, silently;
    * a reservation whose submit ended before its launch (its ``submit`` ending recorded with
      ``launching`` false), or none at all: nothing started, so the host is powered back off
      (``bring_down``) after ``ask(question)`` says yes or None (no one to ask, or ``--yes``:
      no question), said as "HOST: powered back off — orch powered it on for this submit,
      which failed: WHY";
    * any other reservation (its launch was out, or its ending unknown): unsure, so the host
      stays on, said with ``orch down HOST``.

    A power-off that fails is one warning line naming ``orch down HOST``. The exception always
    goes on as it was (its message and exit code unchanged); the hosts are judged once.
    Nothing happens on a normal exit (the power-on is followed by the submit); ``finish``,
    after a submit that returned, judges the hosts the same way: a sweep whose combinations
    all went to other hosts started none on the job file's."""

    def __init__(self, registry: Registry, *, ask: Callable[[str], bool | None], say: Callable[[str], None]) -> None:
        self.registry, self.ask, self.say = registry, ask, say
        self.hosts: list[Host] = []
        self.before: dict[str, tuple[str, str]] | None = None  # job id -> (state, record) at the first power-on

    def add(self, host: Host) -> None:
        """``host`` is about to be powered on by this command."""
        if self.before is None:
            self.before = {r.job_id: (r.state, _fingerprint(r)) for r in self.registry.all()}
        self.hosts.append(host)

    def __enter__(self) -> PoweredHere:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None and self.hosts and not isinstance(exc, GeneratorExit):
            self.undo(exc)

    def started(self, host: Host) -> tuple[str, str | None]:
        """``("yes" | "no" | "unsure", job id)``: whether a job of this command started on
        ``host``, from the records it added or changed there (see the class docstring);
        unsure when the registry cannot be read."""
        before = self.before or {}

        def ours(record: JobRecord) -> bool:
            was = before.get(record.job_id)
            return was is None or (was[0] == SUBMITTING and was[1] != _fingerprint(record))
        try:
            changed = [r for r in self.registry.all() if host.name in r.hosts and ours(r)]
        except Exception:  # noqa: BLE001 - a registry that cannot be read: unsure, so the box stays on
            return "unsure", None
        ran = next((r for r in changed if r.state != SUBMITTING), None)
        if ran is not None:
            return "yes", ran.job_id
        ended = [r.detail.get("submit") for r in changed]
        unsure = next((r for r, e in zip(changed, ended)
                       if not (isinstance(e, dict) and e.get("launching") is False)), None)
        return ("unsure", unsure.job_id) if unsure is not None else ("no", None)

    def finish(self) -> None:
        """The submit returned: each host added where none of its jobs started (a sweep's
        ``--hosts`` elsewhere) is powered back off as after a failure, said "HOST: powered
        back off — orch powered it on for this submit, which started no job there"."""
        if self.hosts:
            self.undo(None)

    def undo(self, exc: BaseException | None) -> None:
        """Power back off each host added where no job started (the class docstring);
        ``exc`` None: the submit returned (``finish``)."""
        from orchestrator.access.provisioned import bring_down
        from orchestrator.providers.open import provider_of

        why = "started no job there" if exc is None else "failed: " + (
            "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else
            (str(exc).strip().splitlines() or [type(exc).__name__])[0])
        hosts, self.hosts = self.hosts, []
        for host in hosts:
            assert host.provider is not None
            how, job = self.started(host)
            if how == "yes":
                continue
            if how == "unsure":
                self.say(f"{host.name}: left on (billing) — a job of this submit may have started there"
                         + (f" ({job}: orch status {job})" if job else "") + f"; orch down {host.name} powers it off")
                continue
            try:
                state, _ = provider_of(host).state(host.provider.instance)
                if state == "off":  # its power-on never happened (out of stock): nothing to undo
                    continue
                if self.ask(f"Power {host.name} back off (billing stops)?") is False:
                    self.say(f"{host.name}: left on (billing); orch down {host.name} powers it off")
                    continue
                bring_down(host, self.say)
            except Exception as err:  # noqa: BLE001 - the submit's own error is what the command reports
                first = (str(err).strip().splitlines() or [type(err).__name__])[0]
                self.say(f"warning: {host.name}: powering it back off failed ({first}): orch down {host.name}")
                continue
            self.say(f"{host.name}: powered back off — orch powered it on for this submit, which {why}")


def _fingerprint(record: JobRecord) -> str:
    """What of a job record tells that a command changed it: its state and detail."""
    return json.dumps([record.state, record.detail], sort_keys=True, default=str)


def power_off_after(inventory: Inventory, loaded: LoadedSpec, say: Callable[[str], None]) -> None:
    """``on_finish.power_off`` seen from a watching laptop: power the job's provider hosts off
    through the API once the job ended and the watch's last fetch is done."""
    if not loaded.spec.on_finish.power_off:
        return
    from orchestrator.access.provisioned import bring_down

    for host in provider_hosts(inventory, loaded):
        say(f"on_finish.power_off: powering {host.name} off")
        bring_down(host, say)
        say(f"{host.name}: off")


RELEASE_WARN_DAYS = 3  # a powered-off instance its provider releases sooner is warned about


def instance_ready(host: Host, say: Callable[[str], None]) -> bool:
    """A provider host's instance as its provider reports it now (``facts``, its errors raised):
    its state and price said, a warning when the provider releases it (its data disk with it)
    in under ``RELEASE_WARN_DAYS`` days; true when it is running, so that the checks on the box
    can follow, else said how to power it on."""
    from orchestrator.access.provisioned import facts

    row = facts(host, strict=True)
    say(f"{host.name}: {row['provider']} instance {row['instance']} is {row['state']}" +
        (f", {row['price_per_hour']:g} {row['currency']}/h" if row.get("price_per_hour") is not None else ""))
    left = row.get("release_in_days")
    if isinstance(left, float) and left < RELEASE_WARN_DAYS:
        say(f"warning: {host.name}: {row['provider']} releases this powered-off instance in {left:.1f} days "
            f"(its data disk with it): power it on before then (`orch up {host.name}`)")
    if row["state"] != "running":
        say(f"{host.name}: the checks on the box need it on: orch up {host.name}")
        return False
    return True


def ready_for_system_ssh(inventory: Inventory, host: Host, say: Callable[[str], None]) -> Host:
    """A provider host made ready for the system ssh and VSCode: its endpoint now (exit 3
    naming `orch up` when it is off), orch's own key in the box's authorized_keys when the
    provider gives a password (AutoDL; added once, kept across power cycles with the disk),
    and the endpoint kept in the entry (``Host.seen``, no password) for the ssh-config block.
    Returns the host at that endpoint (``Host.live``): what the command connects to next,
    without asking the provider again."""
    from orchestrator.access.provisioned import connectable

    assert host.provider is not None
    if not host.host_key:
        raise UsageError(f"{host.name}: no pinned host key yet: `orch up {host.name} --trust` first")
    live = connectable(host)
    if not host.identity_file:
        _, public = keys.orch_key(None, say)
        with open_transport(live, inventory, never) as transport:
            if keys.install_key(transport, live, public) == "added":
                say(f"{host.name}: orch's key added to {live.user}'s authorized_keys on the box: the system ssh "
                    "and VSCode log in with it")
    remember_seen(inventory, host, live)
    return live

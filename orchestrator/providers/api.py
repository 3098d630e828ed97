"""The provider interface: what orch asks of a rental API, and the errors it raises.

A provider module (``autodl.py``, ``vast.py``, ``runpod.py``) implements ``Provider`` over its
HTTP API (``Marketplace`` is what the two marketplaces share). Contracts every implementation
keeps:

- every call has a timeout (``http.JsonClient``) and raises ``ProviderError`` naming the
  provider, the call and the provider's own message; a refused token or an unreachable API is
  exit 3 (``ProviderAuthError``, ``ProviderUnreachable``), a refusal by the provider exit 4;
- ``endpoint`` is read fresh on every call and never cached: a power cycle may move the
  instance and change its SSH port and password (the password lives in memory only);
- ``create`` is sent once and never retried (a retry after an ambiguous failure could rent a
  second GPU): a failure that may have happened after the provider acted (a timeout, a reset
  connection, an HTTP 5xx) is ``CreateUncertain``, which says what to check instead;
- ``power_on`` is one call; ``power_on_retrying`` adds the bounded backoff for out of stock.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Literal

from orchestrator import settings
from orchestrator.errors import OrchError

# What orch makes of a provider's own words for an instance's state. ``preempted``: an
# interruptible instance that lost its GPU to a higher bid or to the provider (vast's outbid
# instance, RunPod's interrupted spot pod) — off, its disk kept, no job running on it.
State = Literal["running", "off", "starting", "stopping", "creating", "released", "failed", "preempted", "unknown"]
# States in which the instance holds no GPU and runs nothing (its disk may still be billed).
STOPPED: tuple[State, ...] = ("off", "released", "preempted")


class ProviderError(OrchError):
    """A provider refused a call or answered nonsense (exit 4). ``str()`` is
    ``PROVIDER CALL: MESSAGE`` with the provider's own words."""

    exit_code = 4

    def __init__(self, provider: str, call: str, message: str, status: int | None = None) -> None:
        self.provider, self.call, self.message, self.status = provider, call, message, status
        super().__init__(f"{provider} {call}: {message}")


class ProviderAuthError(ProviderError):
    """The provider refused the token (exit 3, like a refused SSH login)."""

    exit_code = 3


class ProviderUnreachable(ProviderError):
    """The provider's API did not answer in time or could not be reached (exit 3).
    ``maybe_sent``: false only when the request surely never reached the provider (the
    connection was refused, the name did not resolve)."""

    exit_code = 3

    def __init__(self, provider: str, call: str, message: str, maybe_sent: bool = True) -> None:
        super().__init__(provider, call, message)
        self.maybe_sent = maybe_sent


class CreateUncertain(ProviderError):
    """A create call failed in a way that does not say whether an instance was rented; it is
    never retried. The message names what to check (exit 4)."""


class OutOfStock(ProviderError):
    """No free GPU of the instance's kind where it lives; power-on may work later."""


class NotSupported(ProviderError):
    """The provider has no such call (AutoDL rents no marketplace offers, say)."""


@dataclass(frozen=True)
class Instance:
    """One instance as the provider reports it. ``price_per_hour`` in ``currency`` (None when
    the provider did not say); ``release_at``: when a powered-off instance will be deleted by
    the provider (None when it is on or the provider never deletes). ``label`` (the name or
    label it was created with), ``gpu`` (its GPUs in words, ``1x RTX 4090``) and ``created_at``
    where the provider reports them (``instances`` fills them; "" and None otherwise)."""

    id: str
    state: State
    status: str
    price_per_hour: float | None = None
    currency: str = ""
    release_at: datetime | None = None
    label: str = ""
    gpu: str = ""
    created_at: datetime | None = None
    gpu_held: bool = False
    interruptible: bool = False

    @property
    def bills(self) -> bool:
        """Whether the instance is (or may be) charged for: on, on its way up or down, being
        created, off while its provider still holds its GPU, ``failed`` — still rented (vast's
        ``exited``/``offline``, RunPod's ``ERROR``, AutoDL's ``failed``) until someone releases
        it — or in a state orch does not know (vast's ``unknown``: no word from its host). Off,
        released and preempted instances bill at most their disk."""
        return self.state not in STOPPED or self.gpu_held

    @property
    def preempted(self) -> bool:
        """The provider took the instance's GPU back (outbid, interrupted): what a caller that
        watches a box tests for (``state == "preempted"``)."""
        return self.state == "preempted"


@dataclass(frozen=True)
class Balance:
    """What the account holds, as the provider reports it (AutoDL's wallet, vast's credit)."""

    amount: float
    currency: str


@dataclass(frozen=True)
class Offer:
    """One rentable machine of a marketplace, as ``search`` found it: ``price_per_hour`` for the
    whole machine (every GPU) in ``currency``; ``reliability`` in 0..1 and ``disk_gb`` where
    the provider reports them (None otherwise); ``ref``: what ``create`` needs of it."""

    provider: str
    id: str
    gpu: str
    count: int
    price_per_hour: float
    currency: str = "USD"
    gpu_memory_gb: float | None = None
    disk_gb: float | None = None
    reliability: float | None = None
    where: str = ""
    ref: tuple[tuple[str, str], ...] = ()
    bid: float | None = None
    on_demand_per_hour: float | None = None

    @property
    def interruptible(self) -> bool:
        """An offer rented as an interruptible (spot) instance at ``bid``: ``price_per_hour``
        is then the bid (what it costs while it runs), ``on_demand_per_hour`` the provider's
        price for the same machine rented on demand (None where it did not say)."""
        return self.bid is not None

    def describe(self) -> str:
        """``1x RTX 4090 (24 GB), 0.35 USD/h, reliability 0.99, disk 100 GB, Norway``; an
        interruptible offer ``..., bid 0.2 USD/h (interruptible; on demand 0.41 USD/h), ...``."""
        price = f"{self.price_per_hour:.3g} {self.currency}/h"
        if self.bid is not None:
            price = f"bid {price} (interruptible" + (
                f"; on demand {self.on_demand_per_hour:.3g} {self.currency}/h)" if self.on_demand_per_hour is not None
                else ")")
        words = [f"{self.count}x {self.gpu}" + (f" ({self.gpu_memory_gb:g} GB)" if self.gpu_memory_gb else ""), price]
        if self.reliability is not None:
            words.append(f"reliability {self.reliability:.3f}".rstrip("0").rstrip("."))
        if self.disk_gb is not None:
            words.append(f"disk up to {self.disk_gb:.0f} GB")
        if self.where:
            words.append(self.where)
        return ", ".join(words)


@dataclass(frozen=True)
class Wanted:
    """What ``orch rent`` asks a marketplace for: ``gpu`` matched against the provider's GPU
    names without regard to case, spaces, dashes or underscores. ``interruptible``: an
    interruptible (spot) instance, rented by a bid: ``bid`` USD per hour for the whole
    instance (None: the offer's own minimum bid); an offer whose minimum bid is above ``bid``
    does not match, and ``max_price`` caps the bid placed. Without ``interruptible`` a ``bid``
    is refused (``problem``)."""

    gpu: str
    count: int = 1
    max_price: float | None = None
    disk_gb: int = 40
    min_reliability: float | None = None
    interruptible: bool = False
    bid: float | None = None

    def problem(self) -> str | None:
        """What is wrong with the request as a whole (a bid without ``interruptible``, a bid
        above ``max_price``, a bid that is not a positive price); None when nothing is."""
        if self.bid is not None and not self.interruptible:
            return "a bid is for an interruptible instance: add --interruptible"
        if self.bid is not None and not (self.bid > 0):
            return f"the bid must be a positive price, not {self.bid:g}"
        if self.bid is not None and self.max_price is not None and self.bid > self.max_price:
            return f"the bid {self.bid:g} is above --max-price {self.max_price:g}"
        return None

    def bid_for(self, min_bid: float) -> float | None:
        """The bid to place on an offer whose minimum bid is ``min_bid``: ``bid`` where given
        (None when it is below the minimum: the offer does not match), else the minimum; None
        when that is above ``max_price``."""
        placed = min_bid if self.bid is None else self.bid
        if placed < min_bid or (self.max_price is not None and placed > self.max_price):
            return None
        return round(placed, 4)

    def gpu_matches(self, *names: str) -> bool:
        want = _squash(self.gpu)
        return any(want == _squash(name) or (len(want) >= 3 and want in _squash(name)) for name in names if name)


def _squash(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


@dataclass(frozen=True)
class Endpoint:
    """Where the instance's sshd answers now. ``user`` None: the provider does not say (the
    host entry's user logs in, root unless given). The password is never printed (``repr``)."""

    address: str
    port: int
    user: str | None
    password: str | None = field(default=None, repr=False)


class Provider:
    """One provider's API for one token. Marketplace calls are optional.

    ``release_needs_off``: ``release`` is refused by the provider unless the instance is off
    (AutoDL); a marketplace destroys an instance in any state. ``console``: where a person
    checks their instances (named by ``CreateUncertain``)."""

    name = "provider"
    release_needs_off = True
    console = ""

    def instance(self, instance_id: str) -> Instance:
        raise NotImplementedError

    def state(self, instance_id: str) -> tuple[State, str]:
        """orch's word for the instance's state and the provider's own (the cheapest call)."""
        found = self.instance(instance_id)
        return found.state, found.status

    def endpoint(self, instance_id: str) -> Endpoint:
        """The SSH endpoint and credentials now (never cached across calls)."""
        raise NotImplementedError

    def stopped_at(self, instance_id: str) -> datetime | None:
        """When the instance last stopped, where the provider says (AutoDL's ``stopped_at``);
        None where it does not. Asked once per job whose box orch finds down (its cost ends there)."""
        return None

    def power_on(self, instance_id: str) -> None:
        raise NotImplementedError

    def power_off(self, instance_id: str) -> None:
        raise NotImplementedError

    def release(self, instance_id: str) -> None:
        """Give the instance back for good (its disks go with it)."""
        raise NotSupported(self.name, "release", "not available")

    def instances(self) -> list[Instance]:
        """Every instance this token's account holds now, in any state but released (what
        it may be billed for), with ``label``, ``gpu`` and ``created_at`` where the provider
        says them: ``orch instances`` compares them with the host entries."""
        raise NotSupported(self.name, "instances", "listing the account's instances is not available")

    def balance(self) -> Balance | None:
        """The account's balance where the provider reports one (None where it does not)."""
        return None

    def search(self, wanted: Wanted) -> list[Offer]:
        """Offers matching ``wanted``, the cheapest first."""
        raise NotSupported(self.name, "search", "this provider has no marketplace offers")

    def create(self, offer: Offer, image: str, disk_gb: int, label: str, public_key: str) -> str:
        """Rent ``offer`` with ``image`` and ``disk_gb``; the new instance's id. Sent once;
        ``public_key`` (an OpenSSH line) goes in where the provider takes one at creation. An
        interruptible offer (``offer.bid``) is rented as one, at that bid; a bid the provider
        refuses (below its minimum) is a ``ProviderError`` with the provider's words."""
        raise NotSupported(self.name, "create", "not available through orch")

    def change_bid(self, instance_id: str, bid: float) -> None:
        """Change an interruptible instance's bid to ``bid`` USD per hour for the instance
        (vast's ``change bid``): a higher bid may win its GPU back."""
        raise NotSupported(self.name, "change bid", f"{self.name} has no bid to change")

    def authorize_key(self, instance_id: str, public_key: str) -> None:
        """Let ``public_key`` log in to a created instance, where the provider takes keys
        after creation (nothing to do where ``create`` took it)."""

    def create_once(self, call: str, send: Callable[[], object]) -> object:
        """``send()`` — the one create request — with an ambiguous failure turned into
        ``CreateUncertain``: what to check, and never a second request."""
        try:
            return send()
        except ProviderAuthError:
            raise
        except ProviderUnreachable as exc:
            if not exc.maybe_sent:
                raise
            cause = exc.message
        except ProviderError as exc:
            if exc.status is None or exc.status < 500:
                raise
            cause = exc.message
        raise CreateUncertain(self.name, call, f"{cause}. The provider may or may not have rented an instance: "
                              f"look at your instances ({self.console}) and destroy one you do not want; "
                              "orch does not try again (a second try could rent a second GPU)")


_ADDRESS = re.compile(r"^[A-Za-z0-9.:\[\]-]{1,253}$")


class Marketplace(Provider):
    """A marketplace (vast.ai, RunPod): an instance is one row of one GET, destroyed in any
    state; a subclass reads the row (``row``: None once the provider no longer knows the
    instance), its state, price and SSH address and port. The login user is the host entry's
    (root on both)."""

    release_needs_off = False
    gone = "destroyed"
    call = "instance"

    def row(self, instance_id: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def row_state(self, row: dict[str, Any]) -> tuple[State, str]:
        raise NotImplementedError

    def row_price(self, row: dict[str, Any]) -> object:
        raise NotImplementedError

    def row_ssh(self, row: dict[str, Any]) -> tuple[object, object]:
        """The row's SSH address and port as the provider wrote them (checked by ``endpoint``)."""
        raise NotImplementedError

    def instance(self, instance_id: str) -> Instance:
        row = self.row(instance_id)
        if row is None:
            return Instance(id=instance_id, state="released", status=self.gone)
        state, status = self.row_state(row)
        price = self.row_price(row)
        return Instance(id=instance_id, state=state, status=status, currency="USD",
                        price_per_hour=round(float(price), 4) if isinstance(price, (int, float)) else None)

    def state(self, instance_id: str) -> tuple[State, str]:
        row = self.row(instance_id)
        return ("released", self.gone) if row is None else self.row_state(row)

    def endpoint(self, instance_id: str) -> Endpoint:
        address, port = self.row_ssh(self.row(instance_id) or {})
        if isinstance(port, str) and port.isdigit():
            port = int(port)
        if not (isinstance(address, str) and _ADDRESS.match(address) and isinstance(port, int)
                and 1 <= port <= 65535):
            raise ProviderError(self.name, self.call, "no SSH endpoint yet; the instance may still be starting")
        return Endpoint(address=address, port=port, user=None)


def stock_retry_delays() -> list[float]:
    """Waits between power-on tries while out of stock: ``ORCH_STOCK_TRIES`` tries (5), the
    first wait ``ORCH_STOCK_DELAY_S`` (30 s), doubling, each at most 300 s."""
    tries, delay = settings.STOCK_TRIES.whole(), settings.STOCK_DELAY.seconds()
    return [min(300.0, delay * 2 ** i) for i in range(tries - 1)]


def power_on_retrying(provider: Provider, instance_id: str, say: Callable[[str], None],
                      sleep: Callable[[float], None] = time.sleep) -> None:
    """``power_on``, tried again after ``stock_retry_delays`` while the provider says it is out
    of stock (each wait said), then ``OutOfStock`` with how often it was tried. Any other
    error is raised at once."""
    delays = stock_retry_delays()
    for attempt in range(len(delays) + 1):
        try:
            provider.power_on(instance_id)
            return
        except OutOfStock as exc:
            if attempt == len(delays):
                raise OutOfStock(exc.provider, exc.call,
                                 f"{exc.message} (tried {attempt + 1} times over "
                                 f"{sum(delays):g} s; try again later, or another GPU or region)") from None
            say(f"{provider.name}: out of stock ({exc.message}); trying again in {delays[attempt]:g} s "
                f"({attempt + 1}/{len(delays) + 1})")
            sleep(delays[attempt])

"""Renting a marketplace instance and adding it as a host: the library behind ``orch rent`` for
vast.ai and RunPod, callable without a terminal (the managed jobs' controller rents replacements
through it).

``RentRequest`` is what is asked (the provider, the GPUs, the price cap, and for an
interruptible (spot) instance ``interruptible`` and ``bid``); ``offers`` searches the provider
(the cheapest first; none is a ``ProviderError`` saying what was asked); ``rent_offer`` rents
one offer once (never retried: a second try could rent a second GPU), saves the host entry at
once (provider, instance, token variable NAME, the price or bid — never the token), lets orch's
key in and waits until an SSH login works (the host key pinned), and returns the entry;
``rent`` is both for a caller that asks no one (the best offer, rented). Nothing here prints
or asks: progress goes through ``say``. On a failure after the create the instance is rented
and billing: ``say`` tells how to go on (``orch up NAME``, ``orch release NAME``) and the error
is raised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.access import keys
from orchestrator.access.power import login, remember_price
from orchestrator.access.provisioned import bring_up
from orchestrator.errors import UsageError
from orchestrator.hosts.inventory import DEFAULT_ROOT, LOCAL, Host, Inventory, ProviderRef
from orchestrator.providers.api import Offer, Provider, ProviderError, Wanted
from orchestrator.providers.open import open_named
from orchestrator.providers.registry import PROVIDERS, RENTABLE

Say = Callable[[str], None]


class RentRequest(BaseModel):
    """One rental: ``name`` the host entry to make; ``gpu``/``count``/``max_price`` (USD per
    hour for the whole instance)/``disk_gb``/``min_reliability`` as ``orch rent`` takes them;
    ``interruptible`` rents an interruptible (spot) instance by a bid — ``bid`` USD per hour for
    the whole instance, None for the offer's least bid; ``max_price`` then caps the bid.
    ``token_env`` None: the provider's default variable."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    provider: str
    gpu: str = Field(min_length=1, max_length=80)
    count: int = Field(1, ge=1, le=16)
    max_price: float | None = Field(None, gt=0)
    disk_gb: int = Field(40, ge=5, le=10000)
    min_reliability: float | None = Field(None, ge=0, le=1)
    image: str | None = None
    interruptible: bool = False
    bid: float | None = Field(None, gt=0)
    token_env: str | None = None
    api_url: str | None = None
    key: Path | None = None
    root: str | None = None
    python: str = "python3"
    user: str = "root"

    def wanted(self) -> Wanted:
        """What the provider's search is asked; a bid without ``interruptible`` or above
        ``max_price`` is a ``UsageError`` (exit 2)."""
        wanted = Wanted(gpu=self.gpu, count=self.count, max_price=self.max_price, disk_gb=self.disk_gb,
                        min_reliability=self.min_reliability, interruptible=self.interruptible, bid=self.bid)
        problem = wanted.problem()
        if problem:
            raise UsageError(problem)
        return wanted

    def variable(self) -> str:
        return self.token_env or PROVIDERS[self.provider].token_env


def draft(inventory: Inventory, request: RentRequest) -> Host:
    """The entry the rental will be saved as (its instance still ``new``): exit 2 when the
    provider does not rent offers, the name is taken or a field is invalid."""
    if request.provider not in RENTABLE:
        raise UsageError(f"{request.provider} is not a provider orch rents from (one of {', '.join(RENTABLE)})")
    if request.name == LOCAL or (inventory.dir / f"{request.name}.json").is_file():
        raise UsageError(f"a host named {request.name} exists already: choose another name (orch hosts ls)")
    facts = PROVIDERS[request.provider]
    if request.interruptible and not facts.interruptible:
        raise UsageError(facts.no_interruptible or f"{request.provider} rents no interruptible instances")
    try:
        return Host(name=request.name, root=request.root or facts.root or DEFAULT_ROOT, python=request.python,
                    user=request.user, presets=facts.presets,
                    provider=ProviderRef(name=request.provider, instance="new",  # type: ignore[arg-type]
                                         token_env=request.variable(), api_url=request.api_url))
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error.get("loc", ()))
        raise UsageError(f"invalid {where}: {str(error['msg']).removeprefix('Value error, ')}") from None


def market(request: RentRequest) -> Provider:
    """The request's provider, opened with its token (exit 2 without one)."""
    return open_named(request.provider, request.variable(), request.api_url)


def offers(provider: Provider, request: RentRequest) -> list[Offer]:
    """The provider's offers for ``request``, the cheapest first (an interruptible request: by
    the bid placed); none is a ``ProviderError`` (exit 4) naming what was asked."""
    found = provider.search(request.wanted())
    if found:
        return found
    currency = PROVIDERS[request.provider].currency
    kind = "interruptible " if request.interruptible else ""
    cap = (f" with a minimum bid at or under {request.bid:g} {currency}/h" if request.bid is not None
           else f" under {request.max_price:g} {currency}/h" if request.max_price is not None else "")
    raise ProviderError(request.provider, "search", f"no {kind}offer of {request.count}x {request.gpu}{cap} with "
                        f"{request.disk_gb} GB of disk matches now: try another GPU, price or disk"
                        + (" (or a higher --bid)" if request.interruptible else ""))


def rent_offer(inventory: Inventory, request: RentRequest, provider: Provider, offer: Offer, say: Say) -> Host:
    """Rent ``offer`` once, save the entry, let orch's key in and wait until SSH answers (the
    host key pinned: ``orch up --trust``); the saved, live-checked entry. An interruptible
    offer is rented at its bid (kept in the entry as its price)."""
    host = draft(inventory, request)
    facts = PROVIDERS[request.provider]
    assert facts.image is not None and host.provider is not None  # RENTABLE providers have an image
    private, public_line = keys.orch_key(request.key, say)
    instance = provider.create(offer, request.image or facts.image, request.disk_gb, f"orch-{request.name}",
                               public_line)
    host = host.model_copy(update={"provider": host.provider.model_copy(update={"instance": instance}),
                                   "identity_file": str(private), "price_per_hour": offer.price_per_hour})
    inventory.save(host)
    what = (f"bid {offer.price_per_hour:.3g} {offer.currency}/h, interruptible" if offer.interruptible
            else f"{offer.price_per_hour:.3g} {offer.currency}/h")
    say(f"{request.name}: rented {provider.name} instance {instance} at {what}; waiting until SSH answers")
    try:
        provider.authorize_key(instance, public_line)
    except BaseException:
        say(billing_words(host, provider, instance))
        raise
    return wait_up(inventory, host, provider, instance, say)


def wait_up(inventory: Inventory, host: Host, provider: Provider, instance: str, say: Say) -> Host:
    """Wait until the rented instance answers SSH (its host key pinned), keep its price, say so;
    on any failure say that it is rented and billing and how to go on."""
    try:
        live = bring_up(host, say, login(inventory, say, trust=True))
    except BaseException:
        say(billing_words(host, provider, instance))
        raise
    remember_price(inventory, host)
    say(f"{host.name}: up, SSH answers at {live.user}@{live.address}:{live.port}; `orch down {host.name}` stops "
        f"it, `orch release {host.name}` destroys it")
    return inventory.get(host.name)


def billing_words(host: Host, provider: Provider, instance: str) -> str:
    return (f"{host.name}: {provider.name} instance {instance} is rented and billing: `orch up {host.name}` waits "
            f"for it again, `orch release {host.name}` destroys it")


def rent(inventory: Inventory, request: RentRequest, say: Say) -> Host:
    """For a caller that asks no one (the managed jobs' controller): the cheapest matching
    offer, said, then ``rent_offer``. Raises as ``offers`` and ``rent_offer`` do."""
    draft(inventory, request)
    provider = market(request)
    best = offers(provider, request)[0]
    say(f"{request.provider} offer {best.id}: {best.describe()}")
    return rent_offer(inventory, request, provider, best, say)

"""The provider interface: what orch asks of a rental API, and the errors it raises.

A provider module (``autodl.py``) implements ``Provider`` over its HTTP API. Contracts every
implementation keeps:

- every call has a timeout (``http.JsonClient``) and raises ``ProviderError`` naming the
  provider, the call and the provider's own message; a refused token or an unreachable API is
  exit 3 (``ProviderAuthError``, ``ProviderUnreachable``), a refusal by the provider exit 4;
- ``endpoint`` is read fresh on every call and never cached: a power cycle may move the
  instance and change its SSH port and password (the password lives in memory only);
- ``create`` is never retried (a retry after an ambiguous failure could rent a second GPU);
- ``power_on`` is one call; ``power_on_retrying`` adds the bounded backoff for out of stock.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Literal

from orchestrator.errors import OrchError

# What orch makes of a provider's own words for an instance's state.
State = Literal["running", "off", "starting", "stopping", "creating", "released", "failed", "unknown"]


class ProviderError(OrchError):
    """A provider refused a call or answered nonsense (exit 4). ``str()`` is
    ``PROVIDER CALL: MESSAGE`` with the provider's own words."""

    exit_code = 4

    def __init__(self, provider: str, call: str, message: str) -> None:
        self.provider, self.call, self.message = provider, call, message
        super().__init__(f"{provider} {call}: {message}")


class ProviderAuthError(ProviderError):
    """The provider refused the token (exit 3, like a refused SSH login)."""

    exit_code = 3


class ProviderUnreachable(ProviderError):
    """The provider's API did not answer in time or could not be reached (exit 3)."""

    exit_code = 3


class OutOfStock(ProviderError):
    """No free GPU of the instance's kind where it lives; power-on may work later."""


class NotSupported(ProviderError):
    """The provider has no such call (AutoDL rents no marketplace offers, say)."""


@dataclass(frozen=True)
class Instance:
    """One instance as the provider reports it. ``price_per_hour`` in ``currency`` (None when
    the provider did not say); ``release_at``: when a powered-off instance will be deleted by
    the provider (None when it is on or the provider never deletes)."""

    id: str
    state: State
    status: str
    price_per_hour: float | None = None
    currency: str = ""
    release_at: datetime | None = None


@dataclass(frozen=True)
class Endpoint:
    """Where the instance's sshd answers now. The password is never printed (``repr``)."""

    address: str
    port: int
    user: str
    password: str | None = field(default=None, repr=False)


class Provider:
    """One provider's API for one token. Marketplace calls are optional."""

    name = "provider"

    def instance(self, instance_id: str) -> Instance:
        raise NotImplementedError

    def state(self, instance_id: str) -> tuple[State, str]:
        """orch's word for the instance's state and the provider's own (the cheapest call)."""
        found = self.instance(instance_id)
        return found.state, found.status

    def endpoint(self, instance_id: str) -> Endpoint:
        """The SSH endpoint and credentials now (never cached across calls)."""
        raise NotImplementedError

    def power_on(self, instance_id: str) -> None:
        raise NotImplementedError

    def power_off(self, instance_id: str) -> None:
        raise NotImplementedError

    def release(self, instance_id: str) -> None:
        raise NotSupported(self.name, "release", "not available")

    def search(self, **wanted: object) -> list[dict[str, object]]:
        raise NotSupported(self.name, "search", "this provider has no marketplace offers")

    def create(self, **wanted: object) -> str:
        raise NotSupported(self.name, "create", "not available through orch")


def stock_retry_delays() -> list[float]:
    """Waits between power-on tries while out of stock: ``ORCH_STOCK_TRIES`` tries (5), the
    first wait ``ORCH_STOCK_DELAY_S`` (30 s), doubling, each at most 300 s."""
    tries = max(1, int(os.environ.get("ORCH_STOCK_TRIES", "5")))
    delay = float(os.environ.get("ORCH_STOCK_DELAY_S", "30"))
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

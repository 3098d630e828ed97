"""Provider hosts: connect at the endpoint the provider gives now, power them on and off.

A provider host's address, port and password are asked of its provider on every connection and
never kept (``Host.live``); such a host never goes through a connection holder (a holder would
outlive the credentials). ``bring_up`` waits until SSH really answers, re-reading the
credentials on each try (``running`` comes before sshd accepts connections, and a power cycle
may change the port and password); ``bring_down`` waits until the provider says the instance is
off. An instance its provider reports as failed (vast: the container's process exited, the host
went offline) for ``DEAD_GRACE_S`` ends the wait with the provider's words and the way on. Host
keys stay pinned per entry: a different key after a reschedule is refused by
``orchestrator/transport/ssh.py`` with both fingerprints and the command that accepts it.

A connection refused because the provider says the instance is off, released or failed is
``InstanceDown`` (a ``HostError``, worded as before): a follow or a watch stops on it instead of
reconnecting (``jobs/nodes.py``: ``stopped_with_box``), and ``orch status`` stops counting the
job's cost there.
"""

from __future__ import annotations

import time
from typing import Callable

from orchestrator import settings
from orchestrator.errors import HostError, HostKeyError, OrchError
from orchestrator.hosts.inventory import Host
from orchestrator.providers.api import Instance, ProviderError, State, power_on_retrying
from orchestrator.providers.open import provider_of

# How long a failed state must last before orch stops waiting: right after a power-on a provider
# may still report the old dead container for a few seconds (vast's ``exited``).
DEAD_GRACE_S = 20.0
DOWN: tuple[State, ...] = ("off", "released", "failed", "preempted")  # no job runs on the instance any more


class InstanceDown(HostError):
    """``connectable``'s refusal when the provider says the instance is off, released, failed
    or preempted (``DOWN``): the provider's name, the instance, orch's word for the state and the provider's
    own (``status``), for a follow or watch to stop on. The message is ``connectable``'s."""

    def __init__(self, message: str, host: str, provider: str, instance: str, state: State, status: str) -> None:
        super().__init__(message)
        self.host, self.provider, self.instance, self.state, self.status = host, provider, instance, state, status


def up_timeout_s() -> float:
    return settings.UP_TIMEOUT.seconds()


def connectable(host: Host) -> Host:
    """``host`` at its provider's current endpoint; ``HostError`` (exit 3) naming ``orch up``
    when the instance is not running (``InstanceDown`` when it is off, released or failed)."""
    assert host.provider is not None
    provider = provider_of(host)
    state, status = provider.state(host.provider.instance)
    if state != "running":
        message = (f"{host.name}: the {provider.name} instance {host.provider.instance} is {status or state}; "
                   f"power it on with `orch up {host.name}`")
        if state in DOWN:
            raise InstanceDown(message, host.name, provider.name, host.provider.instance, state, status)
        raise HostError(message)
    end = provider.endpoint(host.provider.instance)
    return host.live(end.address, end.port, end.user or host.user, end.password)


def instance_now(host: Host) -> Instance:
    """What ``host``'s provider says of its instance now (one call): its state — ``preempted``
    when the provider took an interruptible instance's GPU back (``Instance.preempted``),
    ``off``, ``released``, ``failed``, ... — its provider's words and price."""
    assert host.provider is not None
    return provider_of(host).instance(host.provider.instance)


def describe(found: Instance) -> str:
    """``running, 1.98 CNY/h``: the state and the price the provider reports."""
    price = f", {found.price_per_hour:g} {found.currency}/h".rstrip() if found.price_per_hour is not None else ""
    return f"{found.status or found.state}{price}"


def bring_up(host: Host, say: Callable[[str], None], probe: Callable[[Host], None]) -> Host:
    """Power ``host`` on when it is off (out of stock: bounded retries, said) and wait until
    ``probe(live_host)`` — an SSH login — succeeds, re-reading state and credentials before
    each try. Returns the live host. ``HostError`` after ``ORCH_UP_TIMEOUT_S`` (600 s); a
    different host key is raised at once; a state the provider calls failed for
    ``DEAD_GRACE_S`` is ``ProviderError`` (exit 4) naming it and ``orch release``/``orch up``."""
    assert host.provider is not None
    provider, instance = provider_of(host), host.provider.instance
    state, status = provider.state(instance)
    if state in ("off", "failed"):
        say(f"{host.name}: powering on {provider.name} instance {instance} ({describe(provider.instance(instance))})")
        power_on_retrying(provider, instance, say)
    elif state == "preempted":
        raise HostError(f"{host.name}: the {provider.name} instance {instance} was preempted ({status}): the "
                        "provider gave its GPU to a higher bid or took it back; it runs again only when it wins its "
                        f"GPU back (vast: a higher bid). `orch release {host.name}` gives it back (its disk bills "
                        "until then)")
    elif state in ("released", "unknown", "stopping"):
        raise HostError(f"{host.name}: the {provider.name} instance {instance} is {status or state}; "
                        "it cannot be powered on now")
    deadline, wait, last = time.monotonic() + up_timeout_s(), 1.0, "it was not running yet"
    dead_since: float | None = None
    while True:
        state, status = provider.state(instance)
        dead_since = (dead_since or time.monotonic()) if state == "failed" else None
        if dead_since is not None and time.monotonic() - dead_since >= DEAD_GRACE_S:
            raise ProviderError(provider.name, "up", f"{host.name}: instance {instance} failed while starting "
                                f"({status or state}); waiting will not bring it up. `orch release {host.name}` "
                                f"gives it back (it may be billing until then), `orch up {host.name}` tries again")
        if state == "running":
            try:
                live = connectable(host)
                probe(live)
                return live
            except HostKeyError:
                raise
            except HostError as exc:
                last = str(exc).splitlines()[0]
        else:
            last = f"the provider says {status or state}"
        if time.monotonic() > deadline:
            raise HostError(f"{host.name}: SSH did not answer within {up_timeout_s():g} s after power-on ({last})")
        time.sleep(wait)
        wait = min(wait * 1.5, 10.0 if dead_since is None else 5.0)


def bring_down(host: Host, say: Callable[[str], None]) -> None:
    """Power ``host`` off and wait until its provider says it is off (``ORCH_UP_TIMEOUT_S``)."""
    assert host.provider is not None
    provider, instance = provider_of(host), host.provider.instance
    state, status = provider.state(instance)
    if state == "off":
        say(f"{host.name}: already off")
        return
    if state == "preempted":  # stopped by its provider; asked to stay off, where the provider takes it
        try:
            provider.power_off(instance)
        except ProviderError as exc:
            say(f"{host.name}: already stopped by {provider.name} (preempted: {status}); {exc.message}")
            return
    elif state != "stopping":  # powering itself off already (on_finish from inside the box)
        provider.power_off(instance)
    deadline = time.monotonic() + up_timeout_s()
    while state != "off":
        if time.monotonic() > deadline:
            raise HostError(f"{host.name}: the provider still says {status or state} "
                            f"{up_timeout_s():g} s after power-off")
        time.sleep(1.0)
        state, status = provider.state(instance)


def days_left(found: Instance, now: float | None = None) -> float | None:
    """Days until the provider releases a powered-off instance (None: it will not)."""
    if found.release_at is None:
        return None
    return (found.release_at.timestamp() - (time.time() if now is None else now)) / 86400


def facts(host: Host, strict: bool = False) -> dict[str, object]:
    """What ``orch hosts ls`` shows of a provider host: state, price, days until release; an
    error of its provider as ``error`` (the listing never stops for one host), raised when
    ``strict``."""
    assert host.provider is not None
    row: dict[str, object] = {"provider": host.provider.name, "instance": host.provider.instance}
    try:
        found = provider_of(host).instance(host.provider.instance)
    except OrchError as exc:
        if strict:
            raise
        return {**row, "state": "?", "error": str(exc)}
    left = days_left(found)
    return {**row, "state": found.status or found.state, "price_per_hour": found.price_per_hour,
            "currency": found.currency, "release_in_days": None if left is None else round(left, 1)}

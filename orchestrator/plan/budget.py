"""Pure: a job's ``max_cost`` and its hosts' prices -> the plan's ``budget`` (job.json), which
each node's supervisor enforces on the box (remote_payload/supervisor/budget.py).

The price is the host entry's ``price_per_hour`` (what ``orch hosts add --price-per-hour`` set,
or what the provider reported when orch last powered the instance on or rented it), in the
host's currency (``currency_of``: the provider's, or none named for a plain host). The job's
price per hour is the sum over its nodes (each node a host). A budget is refused (``Refused``,
exit 2) when a host has no known price, when the hosts' currencies differ, or on a Slurm
cluster, whose allocations are billed by its own accounting.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import SpecError
from orchestrator.hosts.inventory import Host
from orchestrator.providers.registry import PROVIDERS


class Refused(SpecError):
    """``max_cost`` cannot be enforced on these hosts; the message says why and the way on (the
    caller puts the job file's ``file:line:col`` in front)."""


def currency_of(host: Host) -> str:
    """The currency of ``host``'s price: its provider's (``CNY``, ``USD``), "" for a plain host
    (whatever currency its ``--price-per-hour`` was given in)."""
    return PROVIDERS[host.provider.name].currency if host.provider is not None else ""


def budget(max_cost: float | None, hosts: list[Host]) -> dict[str, Any] | None:
    """job.json's ``budget``: ``{"max_cost", "price_per_hour" (every node together),
    "currency"}``, or None without ``max_cost``. Raises ``Refused`` as the module says."""
    if max_cost is None:
        return None
    if any(h.slurm for h in hosts):
        raise Refused(f"{hosts[0].name} is a Slurm cluster, which bills allocations by its own accounting: orch "
                      "cannot price its nodes; leave max_cost out (Slurm's time limit is launch.slurm.time)")
    unpriced = [h for h in hosts if h.price_per_hour is None]
    if unpriced:
        names = ", ".join(h.name for h in unpriced)
        first = unpriced[0]
        how = ("`local` is this machine and has no price" if first.kind == "local" else
               f"give {first.name} one (orch hosts add {first.name} ... --price-per-hour P; a provider host's price "
               "is kept when orch powers it on: orch up)")
        raise Refused(f"no price is known for {names}, so the job's cost cannot be counted: {how}; or leave "
                      "max_cost out")
    currencies = sorted({currency_of(h) for h in hosts})
    if len(currencies) > 1:
        raise Refused(f"the hosts' prices are in different currencies ({', '.join(c or 'none named' for c in currencies)}): "
                      "one max_cost cannot cover them")
    total = sum(h.price_per_hour or 0.0 for h in hosts)
    return {"max_cost": float(max_cost), "price_per_hour": round(total, 6), "currency": currencies[0]}

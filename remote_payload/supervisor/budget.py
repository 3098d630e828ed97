"""``max_cost`` on the box: the supervisor stops its job when the job's cost reaches it, with
the laptop closed (standard library only, Python >= 3.8).

job.json's ``budget`` (``orchestrator/plan/budget.py``) holds ``max_cost``, the job's
``price_per_hour`` (every node together) and its ``currency``. The job's cost is that price
times the time its supervisors ran: this attempt's (from its start, the GPU queue's wait and
the setup included, as ``orch status``'s ELAPSED counts) plus ``run_s_before``, what the
earlier attempts ran (each from its start to its end, or to its last heartbeat when it never
ended: the box went down). An ``orch resume`` of a job its budget stopped begins the count
again (the resume grants another ``max_cost``); after any other end the count goes on. A move
(``orch resume --on``) leaves a status.json without times on the new host (``move/job.py``):
the count begins there, as ``first_started`` does.

``Watch`` is a ``jobdir/duties.py`` duty (``budget``) on every node: each node's supervisor
counts the whole job's cost on its own clock and stops its own part, so every box of a
multi-node job stops (and powers off) by itself. When it is reached, ``stop(reason)`` is called
once: the supervisor cancels its job as ``orch cancel`` does and ends it ``cancelled`` with
``reason`` (``stopped: max_cost 2.00 CNY reached ...``), and ``on_finish`` powers the box off
without waiting for a fetch (``onfinish.shutdown_when_done``). Every value read from job.json
or an earlier status.json is checked (a wrong type counts as absent: no budget, no time).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Callable, Dict, Optional

from remote_payload.jobdir.duties import Duty

REASON_HEAD = "stopped: max_cost"


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def of_job(job: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """job.json's ``budget`` when it is sound (``max_cost`` > 0, ``price_per_hour`` >= 0, a
    currency string), else None: no budget."""
    found = job.get("budget")
    if not isinstance(found, dict):
        return None
    limit, price = _number(found.get("max_cost")), _number(found.get("price_per_hour"))
    currency = found.get("currency", "")
    if limit is None or limit <= 0 or price is None or price < 0 or not isinstance(currency, str):
        return None
    return {"max_cost": limit, "price_per_hour": price, "currency": currency[:16]}


def run_s_before(old: Dict[str, Any]) -> float:
    """What the attempts before this one ran, in seconds, from the status.json the last of them
    left (``old``): its own ``run_s_before`` plus its run, from ``started`` to ``ended`` (or
    its last ``heartbeat``). 0 when the last attempt was stopped by its budget (a resume
    grants the budget again) or nothing sound is recorded."""
    if old.get("budget_reached") is True:
        return 0.0
    before = max(_number(old.get("run_s_before")) or 0.0, 0.0)
    started = _number(old.get("started"))
    end = _number(old.get("ended")) or _number(old.get("heartbeat"))
    ran = max(end - started, 0.0) if started is not None and end is not None else 0.0
    return before + ran


def money(amount: float) -> str:
    """``2.00``; a small amount with its digits (``0.0011``)."""
    return "%.2f" % amount if amount >= 0.01 or amount == 0 else "%.2g" % amount


def duration(seconds: float) -> str:
    """``42s``, ``5m03s``, ``2h07m``."""
    s = int(max(seconds, 0))
    if s < 60:
        return "%ds" % s
    if s < 3600:
        return "%dm%02ds" % (s // 60, s % 60)
    return "%dh%02dm" % (s // 3600, s % 3600 // 60)


def reason(budget: Dict[str, Any], run_s: float) -> str:
    """``stopped: max_cost 2.00 CNY reached (2.01 CNY: 1.98 CNY/h for 1h01m)``."""
    unit = (" " + budget["currency"]) if budget["currency"] else ""
    spent = budget["price_per_hour"] * run_s / 3600
    return "%s %s%s reached (%s%s: %s%s/h for %s)" % (
        REASON_HEAD, money(budget["max_cost"]), unit, money(spent), unit, "%g" % budget["price_per_hour"], unit,
        duration(run_s))


class Watch:
    """The ``budget`` duty: every ``every_s`` seconds, the job's cost against ``max_cost``;
    ``stop(reason)`` once when it is reached. ``started``: this attempt's start (the
    supervisor's clock); ``before_s``: ``run_s_before``."""

    def __init__(self, budget: Dict[str, Any], started: float, before_s: float, stop: Callable[[str], None],
                 say: Callable[[str], None], every_s: float) -> None:
        self.budget, self.started, self.before_s, self.stop_job = budget, started, before_s, stop
        self.fired = threading.Event()
        self.duty = Duty("budget", every_s, self.check, say)

    def run_s(self, now: Optional[float] = None) -> float:
        """Seconds the job has run, every attempt counted."""
        return self.before_s + max((time.time() if now is None else now) - self.started, 0.0)

    def reached(self, now: Optional[float] = None) -> Optional[str]:
        """The reason when the cost has reached ``max_cost`` at ``now``, else None."""
        run_s = self.run_s(now)
        if self.budget["price_per_hour"] * run_s / 3600 >= self.budget["max_cost"]:
            return reason(self.budget, run_s)
        return None

    def check(self) -> None:
        """One period: ``stop`` with the reason the first time the budget is reached."""
        if self.fired.is_set():
            return
        why = self.reached()
        if why is not None:
            self.fired.set()
            self.stop_job(why)


def watch(job: Dict[str, Any], started: float, before_s: float, stop: Callable[[str], None],
          say: Callable[[str], None]) -> Optional[Watch]:
    """The job's ``Watch`` (not started), or None when job.json has no sound budget; it looks
    every heartbeat period."""
    budget = of_job(job)
    if budget is None:
        return None
    every = _number(job.get("heartbeat_s")) or 2.0
    return Watch(budget, started, before_s, stop, say, min(max(every, 0.05), 60.0))

"""The supervisor's ``max_cost`` arithmetic (remote_payload/supervisor/budget.py), pure: what the
earlier attempts ran, the reason it writes, and job.json's budget read as untrusted. The stop
itself, under a real supervisor through the CLI: tests/e2e/daily/test_budget.py and
tests/e2e/provider/test_budget.py."""

from __future__ import annotations

from typing import List

from remote_payload.supervisor import budget

BUDGET = {"max_cost": 2.0, "price_per_hour": 1.98, "currency": "CNY"}


def test_earlier_attempts_count_from_start_to_end_or_to_the_last_heartbeat() -> None:
    assert budget.run_s_before({"started": 100.0, "ended": 160.0, "run_s_before": 40.0}) == 100.0
    assert budget.run_s_before({"started": 100.0, "heartbeat": 130.0}) == 30.0  # the box went down
    assert budget.run_s_before({}) == 0.0


def test_a_resume_after_a_budget_stop_counts_from_zero_again() -> None:
    assert budget.run_s_before({"started": 0.0, "ended": 9999.0, "run_s_before": 5.0, "budget_reached": True}) == 0.0


def test_untrusted_times_count_as_absent() -> None:
    assert budget.run_s_before({"started": "x", "ended": 5.0, "run_s_before": True}) == 0.0
    assert budget.run_s_before({"started": 10.0, "ended": 5.0, "run_s_before": -50.0}) == 0.0


def test_only_a_sound_budget_is_enforced() -> None:
    assert budget.of_job({"budget": BUDGET}) == BUDGET
    for wrong in ({"max_cost": 0, "price_per_hour": 1.0}, {"max_cost": 1, "price_per_hour": -1},
                  {"max_cost": float("nan"), "price_per_hour": 1.0}, {"max_cost": True, "price_per_hour": 1.0},
                  {"max_cost": 1, "price_per_hour": 1.0, "currency": 5}, "2.0", None):
        assert budget.of_job({"budget": wrong}) is None, wrong


def test_the_watch_stops_once_when_the_cost_reaches_max_cost() -> None:
    stops: List[str] = []
    watch = budget.Watch(BUDGET, started=1000.0, before_s=1800.0, stop=stops.append, say=lambda line: None,
                         every_s=1.0)
    assert watch.reached(now=1000.0 + 1800.0) is None  # 1 h: 1.98 CNY
    assert watch.reached(now=1000.0 + 1837.0) == "stopped: max_cost 2.00 CNY reached (2.00 CNY: 1.98 CNY/h for 1h00m)"
    watch.started = 0.0  # long past
    watch.check()
    watch.check()
    assert len(stops) == 1 and stops[0].startswith("stopped: max_cost 2.00 CNY reached (")


def test_small_amounts_keep_their_digits_and_a_plain_host_names_no_currency() -> None:
    plain = {"max_cost": 0.005, "price_per_hour": 3.6, "currency": ""}
    assert budget.reason(plain, 5.0) == "stopped: max_cost 0.005 reached (0.005: 3.6/h for 5s)"

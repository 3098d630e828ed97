"""The clocks' offset and server timestamps moved onto the laptop's clock (orchestrator/helper/clock.py):
pure logic; tests/e2e/faults/test_clock_skew.py runs it against a skewed server through the CLI."""

from __future__ import annotations

import pytest

from orchestrator.helper.clock import Offset, to_laptop


def test_the_offset_comes_from_the_reply_with_the_shortest_round_trip_and_ignores_junk() -> None:
    offset = Offset()
    assert offset.correction == 0.0  # no reply yet: the clocks are taken as agreeing
    offset.measure(100.0, 101.0, {"clock": 3700.7})  # midpoint 100.5: 3600.2 ahead
    assert offset.seconds == pytest.approx(3600.2) and offset.correction == 3600.0
    offset.measure(200.0, 210.0, {"clock": 0.0})  # a slower reply teaches less
    assert offset.correction == 3600.0
    for junk in ({"clock": "soon"}, {"clock": True}, {"clock": float("nan")}, {}, None):
        offset.measure(300.0, 300.0, junk)
    assert offset.correction == 3600.0
    close = Offset()
    close.measure(0.0, 0.1, {"clock": 3.05})  # NTP-close clocks: nothing is moved
    assert close.correction == 0.0


def test_every_server_time_of_a_reply_is_moved_and_nothing_else() -> None:
    status = {"state": "running", "started": 4600.0, "heartbeat": 4700, "ended": None, "first_started": "x",
              "metrics": {"time": 4650.0, "step": 7}, "exit_code": 0}
    reply = to_laptop("status", {"jobs": {"j": status}}, 3600.0)
    assert reply["jobs"]["j"] == {"state": "running", "started": 1000.0, "heartbeat": 1100, "ended": None,
                                  "first_started": "x", "metrics": {"time": 1050.0, "step": 7}, "exit_code": 0}
    queue = to_laptop("queue", {"gpus": [], "jobs": [{"since": 4000, "granted": None}], "seen": 3700}, 3600.0)
    assert queue["jobs"] == [{"since": 400, "granted": None}] and queue["seen"] == 100
    hello = to_laptop("hello", {"sync": {"lock": {"started": 3601}}}, 3600.0)
    assert hello["sync"]["lock"]["started"] == 1
    show = to_laptop("show", {"status": {"state": "failed", "ended": 3605}, "moves": [{"at": 3610}, "junk"]}, 3600.0)
    assert show["status"]["ended"] == 5 and show["moves"][0]["at"] == 10
    assert to_laptop("status", {"jobs": {"j": {"started": 5.0}}}, 0.0) == {"jobs": {"j": {"started": 5.0}}}

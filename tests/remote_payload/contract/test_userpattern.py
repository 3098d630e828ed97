"""A user's pattern runs in a worker process under a CPU budget per line
(remote_payload/contract/userpattern.py): a catastrophic one is switched off, never a stall."""

from __future__ import annotations

import os
import signal
import threading
import time

from remote_payload.contract.userpattern import PatternWorker

CATASTROPHIC = r"(?P<step>(x+x+)+)y"  # exponential on a line of x's with no y: 2**40 ways on 40 x's


def test_matches_come_back_as_named_groups_in_order_and_a_batch_is_one_round() -> None:
    worker = PatternWorker(r"it (?P<step>\d+)(?: loss (?P<loss>[\d.]+))?")
    try:
        lines = ["it %d loss 2.5" % i if i % 3 else "nothing here" for i in range(3000)] + ["it 7"]
        found = worker.search_all(lines)
        assert found[0] is None and found[1] == {"step": "1", "loss": "2.5"}
        assert found[-1] == {"step": "7"}  # a group that did not match is left out
        assert len(found) == len(lines) and worker.off is None
        assert worker.search_all([]) == []
    finally:
        worker.close()


def test_a_line_that_blows_the_budget_switches_the_pattern_off_and_the_asker_stays_free() -> None:
    """The asking process's other threads run while the worker spins (the GIL is the worker's
    own); the worker ends at its CPU budget, by the kernel; every later line answers None."""
    worker = PatternWorker(CATASTROPHIC, budget_s=0.5)
    pid = worker.pid
    ticks: list[float] = []
    stop = threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        found = worker.search_all(["xxy", "x" * 40, "xxy"])
    finally:
        stop.set()
        ticker.join()
    assert found == [{"step": "xx"}, None, None]
    assert worker.off == "it took more than 0.5 s of CPU on a line of 40 characters"
    assert len(ticks) > 5  # this process's threads ran meanwhile
    assert worker.pid is None and pid is not None and not os.path.exists("/proc/%d/cmdline" % pid)  # reaped
    assert worker.search_all(["xxy"]) == [None]


def test_a_pattern_this_python_cannot_read_is_named_and_off() -> None:
    worker = PatternWorker("(?P<step")
    assert worker.compile_error is not None and "missing >" in worker.compile_error
    assert worker.off is not None and worker.off.startswith("it is not a regular expression this Python reads")
    assert worker.search_all(["anything"]) == [None]


def test_a_worker_that_dies_or_stops_answering_switches_the_pattern_off() -> None:
    worker = PatternWorker(r"(?P<step>\d+)")
    assert worker.pid is not None
    os.kill(worker.pid, signal.SIGKILL)
    assert worker.search_all(["5"]) == [None]
    assert worker.off is not None and "its worker ended (signal 9)" in worker.off

    worker = PatternWorker(r"(?P<step>\d+)", wall_s=1.0)
    assert worker.pid is not None
    os.kill(worker.pid, signal.SIGSTOP)  # a worker that never answers: the wall-clock backstop
    try:
        assert worker.search_all(["5"]) == [None]
        assert worker.off == "it gave no answer within 1 s on a line of 1 characters"
    finally:
        worker.close()


def test_a_worker_whose_asker_is_gone_ends_even_mid_search() -> None:
    """The supervisor killed while its worker spins: the worker's budget still ends it."""
    import subprocess
    import sys

    code = ("import sys; from remote_payload.contract.userpattern import PatternWorker as W\n"
            "w = W(%r, budget_s=0.5); print(w.pid, flush=True); w.proc.stdin.write(b'\"' + b'x' * 40 + b'\"\\n')\n"
            "w.proc.stdin.flush(); import os; os._exit(0)" % CATASTROPHIC)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))))
    pid = int(out.stdout.split()[0])
    from tests.support.poll import wait_until

    def ended() -> bool:
        try:
            with open("/proc/%d/stat" % pid) as f:
                return f.read().rsplit(")", 1)[-1].split()[0] == "Z"
        except OSError:
            return True

    wait_until(ended, what="the orphaned worker to end at its budget", timeout=120)

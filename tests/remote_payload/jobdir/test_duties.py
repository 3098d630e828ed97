"""The server's periodic duties (remote_payload/jobdir/duties.py) and their one error policy:
an error is said once with the duty's name, the duty runs again on its next period and says
when it works again, and nothing but ``stop()`` ends it. Real threads; the manifest duty on a
real job folder."""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import Callable, List

import pytest

from remote_payload.jobdir import manifest
from remote_payload.jobdir.duties import Duty, describe

WAIT_S = 60.0  # an upper bound for a thread to get its turn on a loaded machine, never a measured time


def stale() -> OSError:
    return OSError(errno.ESTALE, "Stale file handle", "/nfs/jobs/j/status.json")


def scripted(*outcomes: "BaseException | None") -> "Callable[[], None]":
    """A duty's work that raises each given error in turn (None: succeeds); then succeeds."""
    left = list(outcomes)

    def work() -> None:
        outcome = left.pop(0) if left else None
        if outcome is not None:
            raise outcome
    return work


def test_a_failing_duty_is_said_once_with_its_name_and_its_recovery_is_said_too() -> None:
    said: List[str] = []
    duty = Duty("heartbeat", 2.0, scripted(stale(), stale(), stale(), None, None), said.append)
    for _ in range(5):
        duty.run_once()  # never raises
    assert said == ["heartbeat failed: OSError: [Errno %d] Stale file handle: '/nfs/jobs/j/status.json'; tried again "
                    "every 2 s" % errno.ESTALE,
                    "heartbeat works again (after 3 failed runs)"]


def test_an_error_of_another_kind_is_said_once_and_a_new_streak_is_said_again() -> None:
    said: List[str] = []
    full = OSError(errno.ENOSPC, "No space left on device")
    duty = Duty("manifest", 4.0, scripted(stale(), full, stale(), full, None, stale()), said.append)
    for _ in range(6):
        duty.run_once()
    assert [line.split(":")[0] for line in said] == [
        "manifest failed", "manifest failed", "manifest works again (after 4 failed runs)", "manifest failed"]
    assert "[Errno %d]" % errno.ESTALE in said[0] and "No space left" in said[1] and "No space left" not in said[3]


def test_a_duty_keeps_running_through_errors_until_it_is_stopped_then_runs_its_last_pass() -> None:
    calls: List[int] = []
    sixth, last = threading.Event(), threading.Event()

    def work() -> None:
        calls.append(len(calls) + 1)
        if len(calls) == 6:
            sixth.set()
        if len(calls) % 2:
            raise ValueError("odd run %d" % len(calls))

    said: List[str] = []
    duty = Duty("metrics from the log", 0.01, work, said.append, last=last.set).start()
    assert sixth.wait(WAIT_S), "the duty stopped running after its first error"
    duty.stop(wait_s=WAIT_S)
    assert not duty.thread.is_alive() and last.is_set() and duty.thread.name == "orch-metrics-from-the-log"
    ran = len(calls)
    assert ran >= 6 and calls == list(range(1, ran + 1))
    # a failure, each recovery, a failure again: one line each, never one per period of the same error
    assert said[0] == "metrics from the log failed: ValueError: odd run 1; tried again every 0.01 s"
    assert set(said[1::2]) == {"metrics from the log works again (after 1 failed run)"}
    assert all(line.startswith("metrics from the log failed: ValueError") for line in said[0::2])


def test_a_log_that_fails_too_sends_the_line_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    def broken_log(line: str) -> None:
        raise OSError(errno.EIO, "Input/output error")

    duty = Duty("heartbeat", 2.0, scripted(stale()), broken_log)
    duty.run_once()
    err = capsys.readouterr().err
    assert err.startswith("[orch] heartbeat failed: OSError") and "(and the log failed: OSError: [Errno 5]" in err
    assert describe(ValueError("two\n lines")) == "ValueError: two lines" and describe(KeyError()) == "KeyError"


def test_the_manifest_duty_says_a_failed_build_once_and_keeps_building(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: every exception of the background build swallowed silently."""
    (tmp_path / "out.bin").write_bytes(b"x" * 10)
    real = manifest.build_manifest
    failures = [stale(), stale()]
    built = threading.Event()

    def flaky(*args: object, **kwargs: object) -> dict:
        if failures:
            raise failures.pop()
        done = real(*args, **kwargs)  # type: ignore[arg-type]
        built.set()
        return done

    monkeypatch.setattr(manifest, "build_manifest", flaky)
    monkeypatch.setattr(manifest, "SETTLE_S", -60.0)  # every file counts as settled
    said: List[str] = []
    cache = manifest.ManifestCache(str(tmp_path), 0.01, None, said.append)
    assert built.wait(WAIT_S), "the manifest duty stopped after its first failed build"
    latest = cache.stop()
    assert latest is not None and [f["path"] for f in latest["files"]] == ["out.bin"]
    assert said == ["manifest failed: OSError: [Errno %d] Stale file handle: '/nfs/jobs/j/status.json'; tried again "
                    "every 0.01 s" % errno.ESTALE, "manifest works again (after 2 failed runs)"]

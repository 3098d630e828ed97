"""The one verdict on how a submit that did not start its job ended (orchestrator/jobs/outcome.py):
pure classification of the errors a submit meets. The CLI tests of the same verdict are in
tests/e2e/faults/test_fault_submits.py."""

from __future__ import annotations

import pytest

from orchestrator.errors import HostError, RemoteError, UsageError
from orchestrator.jobs.outcome import FAILED, INTERRUPTED, SubmitEnded, classify


@pytest.mark.parametrize("exc", [
    KeyboardInterrupt(),
    HostError("connection to flaky (127.0.0.1:2222) lost"),
    HostError("flaky: no answer to the keepalive for 30 s (stalled)"),
    RemoteError("box: launch did not answer within 300 s"),
])
def test_cuts_stalls_and_ctrl_c_are_interruptions(exc: BaseException) -> None:
    assert classify(exc).kind == INTERRUPTED


@pytest.mark.parametrize(("text", "cause"), [
    ("box: sync failed: OSError: [Errno 28] No space left on device: '/r/ws/a.bin'", "the disk is full"),
    ("box: sync failed: OSError: [Errno 36] File name too long: '/r/ws/.orch-tmp-1-aaaa'",
     "a file name is too long for that filesystem"),
    ("box: sync failed: PermissionError: [Errno 13] Permission denied: '/r/ws/x'", "permission denied"),
    ("box: sync failed: OSError: [Errno 30] Read-only file system: '/r/ws/x'", "the filesystem is read-only"),
    ("box: sync failed: OSError: [Errno 122] Disk quota exceeded", "the disk quota is used up"),
    ("box: launch failed: the code this submit sent is not staged on this host any more", ""),
])
def test_a_remote_step_that_refused_is_a_failure_named_by_its_cause(text: str, cause: str) -> None:
    ending = classify(RemoteError(text))
    assert (ending.kind, ending.cause, ending.why) == (FAILED, cause, text)


def test_the_message_keeps_the_cause_and_its_exit_code_and_says_which_ending() -> None:
    failed = SubmitEnded(RemoteError("box: sync failed: [Errno 28] No space left on device"), "j-1",
                         classify(RemoteError("[Errno 28] No space left on device")))
    assert failed.exit_code == 4 and str(failed).startswith("box: sync failed")
    assert "failed before j-1 started: the disk is full; nothing was started" in str(failed)
    cut = HostError("connection to box lost")
    interrupted = SubmitEnded(cut, "j-1", classify(cut))
    assert interrupted.exit_code == 3 and "interrupted before j-1 was confirmed started" in str(interrupted)
    kept_changing = SubmitEnded(UsageError("these files kept changing"), "j-1", classify(UsageError("x")))
    assert kept_changing.exit_code == 2 and "failed before j-1 started; nothing was started" in str(kept_changing)


def test_a_failure_once_the_launch_requests_went_out_never_says_nothing_started() -> None:
    """A multi-node launch that one node refused: another node may run; the message says
    where to look instead of "nothing was started"."""
    refused = RemoteError("node2: launch failed: OSError: [Errno 28] No space left on device")
    ending = classify(refused, launching=True)
    message = str(SubmitEnded(refused, "j-1", ending))
    assert ending.kind == FAILED and ending.as_detail()["launching"] is True
    assert "failed while launching j-1: the disk is full; orch status j-1 shows what started" in message
    assert "nothing was started" not in message

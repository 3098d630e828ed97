"""A multi-node job one of whose supervisors is not answering (jobs/nodes.py: aggregate; pure
logic over the statuses the servers' probes report, remote_payload/jobdir/answering.py):
the job keeps its state, carries the silent node's fields, and its row says so. The real
probe and the CLI: tests/e2e/faults/test_fault_silent_supervisor.py."""

from __future__ import annotations

from orchestrator.display.progress import row_fields, table_reason
from orchestrator.jobs.nodes import aggregate

SILENT = {"state": "running", "node_rank": 1, "not_answering_s": 43.2, "heartbeat_age_s": 43.2,
          "supervisor_process": "T (stopped)",
          "reason": "supervisor not answering for 43 s: stopped (SIGSTOP or SIGTSTP; kill -CONT 77 on the host resumes it)"}


def test_the_silent_node_marks_a_running_job_and_names_itself() -> None:
    status = aggregate([{"state": "running", "node_rank": 0, "heartbeat_age_s": 0.4,
                         "supervisor_process": "S (sleeping)"}, SILENT])
    assert status["state"] == "running" and status["not_answering_s"] == 43.2
    assert status["supervisor_process"] == "T (stopped)" and status["reason"].startswith("node 1: supervisor not")
    assert row_fields(status, 0.0, 2, None, None).state == "running (not answering)"


def test_a_finished_job_is_never_marked_not_answering() -> None:
    status = aggregate([{"state": "failed", "node_rank": 0, "reason": "oom"}, SILENT])
    assert status["state"] == "failed" and "not_answering_s" not in status
    assert row_fields(status, 0.0, 2, None, None).state == "failed"


def test_the_table_keeps_the_age_and_the_process_state_of_the_reason() -> None:
    assert table_reason(SILENT["reason"], 1).startswith("43 s: stopped (SIGSTOP")
    assert table_reason("node 1: " + SILENT["reason"], 2).startswith("node 1: supervisor not answering")

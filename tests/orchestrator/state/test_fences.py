"""The laptop's records behind one live attempt across hosts (issue 23): fences written with
a move and settled once, and where each job's laptop copy was kept. Pure SQLite on a real
registry file; the behaviour through the CLI is tests/e2e/move/test_move_fence.py."""

from __future__ import annotations

from pathlib import Path

from orchestrator.state import fences, kits
from orchestrator.state.registry import Registry


def test_a_move_fences_the_hosts_left_and_each_fence_is_settled_once(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    db = registry.path
    assert fences.pending(db) == []  # no table yet: nothing pending, nothing created
    registry.add("j-1", "j", "j.yaml", ["a"], "/r/jobs/j-1", "running")
    registry.move("j-1", ["b"], "/r2/jobs/j-1", {}, superseded=[("a", "/r/jobs/j-1")])
    assert registry.get("j-1").hosts == ["b"]  # the new place and the fence: one transaction
    (fence,) = fences.pending(db, host="a")
    assert (fence.job_id, fence.job_dir, fence.moved_to, fence.settled) == ("j-1", "/r/jobs/j-1", "b", None)
    assert fences.pending(db, host="b") == [] and fences.pending(db, job_ids=[]) == []
    assert fences.pending(db, job_ids=["j-1"]) == [fence]

    assert fences.settle(db, fence, "stopped") is True
    assert fences.settle(db, fence, "again") is False  # another orch settled it first: said once
    assert fences.pending(db) == []

    registry.move("j-1", ["a"], "/r/jobs/j-1", {}, superseded=[("b", "/r2/jobs/j-1")])  # back to a
    assert [(f.host, f.moved_to) for f in fences.pending(db)] == [("b", "a")]
    assert fences.of_job(db, "j-1")[0].host == "b"  # a's fence is gone: the job lives there again


def test_the_laptop_copy_is_recorded_absolute_and_found_from_anywhere(tmp_path: Path, monkeypatch) -> None:
    db = Registry(tmp_path).path
    assert kits.recorded(db, "j-1") is None
    monkeypatch.chdir(tmp_path)
    kits.record(db, "j-1", Path("proj/runs/j-1"))
    assert kits.recorded(db, "j-1") == tmp_path / "proj" / "runs" / "j-1"
    kits.record(db, "j-1", tmp_path / "other" / "j-1")  # the latest watch wins
    assert kits.recorded(db, "j-1") == tmp_path / "other" / "j-1"

"""What the join watch reads from a job's log (supervisor/joinwatch.py, issue 39 item 1): the
pure rule on Lightning's own lines; the whole path through a job is in
tests/e2e/daily/test_self_spawning.py."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from remote_payload.supervisor.joinwatch import JoinWatch, Joins

MEMBER = "Initializing distributed: GLOBAL_RANK: {g}, MEMBER: {m}/{n}"
FORMED = "All distributed processes registered. Starting with {n} processes"


def fed(*timed: tuple[float, str]) -> Joins:
    joins = Joins()
    for at, line in timed:
        joins.line(line, at)
    return joins


def test_rank_zero_alone_and_quiet_for_the_wait_is_named_with_its_line_and_age() -> None:
    joins = fed((0.0, "GPU available: False, used: False"), (1.0, MEMBER.format(g=0, m=1, n=2)))
    assert joins.waiting(100.0, wait_s=120) is None  # not quiet long enough yet
    assert joins.waiting(301.0, wait_s=120) == "waiting for ranks: 1 of 2 joined (Lightning's MEMBER 1/2, 5 min ago)"


def test_a_group_that_formed_or_went_on_is_not_waiting() -> None:
    first = MEMBER.format(g=0, m=1, n=4)
    formed = fed((0.0, first), (0.5, MEMBER.format(g=1, m=2, n=4)), (40.0, "[rank: 0] " + FORMED.format(n=4)))
    assert formed.waiting(1000.0, wait_s=1) is None
    two = fed((0.0, first), (0.1, MEMBER.format(g=1, m=2, n=4)))  # no end line: two of four came
    assert two.waiting(1000.0, wait_s=1) == "waiting for ranks: 2 of 4 joined (Lightning's MEMBER 1/4, 16 min ago)"
    went_on = fed((0.0, first), (500.0, "Epoch 0: 100%| 4/4 loss=0.3"))
    assert went_on.waiting(600.0, wait_s=120) is None  # the job printed since: not stuck (yet)
    assert went_on.waiting(700.0, wait_s=120) == "waiting for ranks: 1 of 4 joined (Lightning's MEMBER 1/4, 11 min ago)"
    all_seen = fed((0.0, first), *[(0.1, MEMBER.format(g=i, m=i + 1, n=4)) for i in range(1, 4)])
    assert all_seen.waiting(1000.0, wait_s=1) is None


def test_a_node_without_rank_zero_and_orchs_own_lines_say_nothing() -> None:
    other_node = fed((0.0, MEMBER.format(g=2, m=3, n=4)), (0.1, MEMBER.format(g=3, m=4, n=4)))
    assert other_node.waiting(1000.0, wait_s=1) is None  # only rank 0 prints the end: this node cannot tell
    ours = fed((0.0, MEMBER.format(g=0, m=1, n=2)), (50.0, "[orch] metrics from the log failed: OSError"))
    assert ours.waiting(60.0, wait_s=30) is not None


def test_a_second_group_forming_starts_over() -> None:
    joins = fed((0.0, MEMBER.format(g=0, m=1, n=2)), (1.0, MEMBER.format(g=1, m=2, n=2)), (2.0, FORMED.format(n=2)),
                (10.0, MEMBER.format(g=0, m=1, n=3)))
    assert joins.waiting(200.0, wait_s=60) == "waiting for ranks: 1 of 3 joined (Lightning's MEMBER 1/3, 3 min ago)"


def test_the_watch_reads_whole_lines_and_says_each_change_once(tmp_path: Path) -> None:
    log = tmp_path / "node0.log"
    log.write_bytes(b"[orch] starting: python x.py\n")
    said: list[str] = []
    notes: list[Optional[str]] = []
    watch = JoinWatch(str(log), said.append, notes.append, wait_s=0.0)
    with log.open("ab") as f:
        f.write(b"Initializing distributed: GLOBAL_RANK: 0, MEM")  # the rest of the line is not written yet
    watch.poll()
    assert notes == [] and watch.joins.members == set()
    with log.open("ab") as f:
        f.write(b"BER: 1/2\n")
    watch.poll()
    watch.poll()
    assert len(said) == 1 and said[0].startswith("waiting for ranks: 1 of 2 joined (Lightning's MEMBER 1/2, ")
    assert notes[0] == said[0]
    with log.open("ab") as f:
        f.write(b"Initializing distributed: GLOBAL_RANK: 1, MEMBER: 2/2\n")
    watch.poll()
    assert notes[-1] is None and said[-1] == "the job went on: no longer waiting for ranks: 1 of 2 joined"


def test_ranks_that_each_said_world_size_one_are_named_once_two_did() -> None:
    """Hugging Face's warning (or accelerate's printed ``Num processes: 1``) from two ranks of a
    job is the alone reason; one rank saying it, or orch's own line, is not."""
    hf = "torch.distributed process group is initialized, but parallel_mode != ParallelMode.DISTRIBUTED. In order"
    assert fed((0.0, hf)).alone_reason() is None
    assert fed((0.0, "[orch] " + hf), (1.0, hf)).alone_reason() is None
    reason = fed((0.0, hf), (1.0, "step 1"), (2.0, hf)).alone_reason()
    assert reason is not None and reason.startswith(
        "2 processes each trained alone (world size 1): Hugging Face's 'parallel_mode != "
        "ParallelMode.DISTRIBUTED' was printed 2 times")
    state = fed(*[(float(i), line) for i, line in enumerate(["Distributed environment: NO", "Num processes: 1",
                                                              "Process index: 0"] * 3)])
    assert (state.alone_reason() or "").startswith("3 processes each trained alone (world size 1): accelerate's "
                                                   "'Num processes: 1' was printed 3 times")
    assert fed((0.0, "Num processes: 12"), (1.0, "Num processes: 12")).alone_reason() is None


def test_the_last_read_after_the_job_ended_names_ranks_alone_only_for_several(tmp_path: Path) -> None:
    hf = "parallel_mode != ParallelMode.DISTRIBUTED"
    for several, expected in ((True, 1), (False, 0)):
        log = tmp_path / f"node{int(several)}.log"
        log.write_text("")
        notes: list[str] = []
        watch = JoinWatch(str(log), lambda _: None, lambda _: None, several=several, alone_note=notes.append)
        log.write_text(f"{hf}\n{hf}")  # the last line unended, as a killed job leaves it
        watch.last()
        assert len(notes) == expected and all(n.startswith("2 processes each trained alone") for n in notes)

"""`orch status` fits the terminal: columns kept by priority, job ids cut to their shortest
unique prefix (still usable with every command), STATE never cut, `--wide` shows all; and an
ambiguous job-id prefix names its matches."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rich.cells import cell_len

from orchestrator.display.progress import STATUS_COLUMNS, StatusRow, row_fields, status_lines, table_reason
from orchestrator.display.table import Column, fit, truncate
from orchestrator.state.registry import Registry, short_ids
from tests.support.orch import Orch, write_job

STATES = ["running", "succeeded", "failed", "setting_up", "pending", "cancelled", "lost"]
ALL_HEADERS = [c.header for c in STATUS_COLUMNS]


def _rows() -> list[StatusRow]:
    """Seven jobs of one long name submitted in the same minute (long unique prefixes), every
    state, a stale one, a failure with a long reason, two hosts with a price."""
    rows = []
    for k, state in enumerate(STATES):
        status = {"state": state, "started": 0.0, "ended": None if state in ("running", "setting_up") else 4000.0,
                  "stale": state == "setting_up",
                  "metrics": {"step": 1234, "total_steps": 20000, "loss": 1.23456, "tokens_per_s": 123456.0, "time": 100.0}}
        progress = row_fields(status, 0.0, 2, None, 1.98, now=5000.0)
        reason = "job exited with code 1: CUDA out of memory while loading the model (\nsee logs)" if state == "failed" else ""
        rows.append(StatusRow(f"gpt2-lora-autodl-20261129-10150{k}-{k:04x}", progress, ["a100", "a100-2"], reason))
    return rows


def _header(lines: list[str]) -> list[str]:
    return lines[0].split()


def _assert_fits(lines: list[str], width: int, states: list[str]) -> None:
    """Every line fits; each job line carries its state words whole (never cut)."""
    assert all(cell_len(line) <= width for line in lines), "\n".join(lines)
    for line, state in zip(lines[1:], states):
        assert re.search(rf"\s{re.escape(state)}(\s|$)", line), (state, line)


@pytest.mark.parametrize("width, headers", [
    (80, ["JOB", "STATE", "STEP", "REASON"]),  # a failed job's reason before the others' loss
    (100, ["JOB", "STATE", "STEP", "LOSS", "REASON"]),  # REASON at its wanted 24 cells: no room for ETA
    (160, ALL_HEADERS),
])
def test_status_lines_keep_columns_by_priority(width: int, headers: list[str]) -> None:
    rows = _rows()
    lines = status_lines(rows, width)
    assert _header(lines) == headers and len(lines) == 1 + len(rows)
    _assert_fits(lines, width, [r.progress.state for r in rows])
    assert "setting_up (stale)" in lines[4]
    ids = [line.split()[0] for line in lines[1:]]
    assert ids == [r.job_id[:32] for r in rows]  # up to the second: the unique part, no "…"
    if width == 160:
        assert "a100,a100-2" in lines[1] and " 5.50 " in lines[1] and "job exited with code 1: CUDA" in lines[3]
        assert lines[3].endswith("…") and "\n" not in lines[3]
    if width <= 100:  # the reason cut to fit, with "…"
        shown = lines[3][lines[0].index("REASON"):]
        assert shown.endswith("…") and len(shown) > 8 and rows[2].reason.startswith(shown[:-1]), lines[3]


def test_a_queued_job_shows_its_place_and_still_fits_80_columns() -> None:
    """`queued #N` (jobs/overview.py: a queued status with its ``queue_position``) is a STATE like
    any other: whole at 80 columns, beside every other state."""
    from orchestrator.jobs.overview import _with_place

    rows = _rows()
    for k, place in enumerate((2, 12)):
        status = _with_place({"state": "queued", "queue_position": place, "started": 0.0,
                              "reason": "waiting for 2 GPU(s); busy with other processes: GPU 0"})
        rows.append(StatusRow(f"gpt2-lora-autodl-20261129-10151{k}-{k:04x}", row_fields(status, 0.0, 1, None, 1.98,
                                                                                        now=60.0), ["a100"], ""))
    assert _with_place({"state": "queued"})["state"] == "queued"  # no place known (yet): the state alone
    assert _with_place({"state": "running", "queue_position": 3})["state"] == "running"
    lines = status_lines(rows, 80)
    _assert_fits(lines, 80, [r.progress.state for r in rows])
    assert lines[-2].split()[1:3] == ["queued", "#2"] and lines[-1].split()[1:3] == ["queued", "#12"]


def test_status_lines_wide_shows_everything() -> None:
    rows = _rows()
    lines = status_lines(rows, None)
    assert _header(lines) == ALL_HEADERS
    assert [line.split()[0] for line in lines[1:]] == [r.job_id for r in rows]
    assert lines[3].endswith("job exited with code 1: CUDA out of memory while loading the model ( see logs)")
    assert max(cell_len(line) for line in lines) > 160


def test_short_ids_are_unique_prefixes_the_registry_resolves(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    ids = ["tiny-20261129-101500-1a2b", "tiny-20261129-101500-1a9f", "tiny-20261129-101501-0000",
           "tiny2-20261129-101500-aaaa", "gpt2-lora-20261129-090000-beef", "odd-id"]
    for job_id in ids:
        registry.add(job_id, "n", "s", ["local"], "/j", "pending")
    short = short_ids(ids)
    assert short["tiny-20261129-101500-1a2b"] == "tiny-20261129-101500-1a2"
    assert short["tiny-20261129-101500-1a9f"] == "tiny-20261129-101500-1a9"
    assert short["tiny-20261129-101501-0000"] == "tiny-20261129-101501"
    assert short["tiny2-20261129-101500-aaaa"] == "tiny2"  # never shorter than the job's name
    assert short["gpt2-lora-20261129-090000-beef"] == "gpt2-lora"
    assert short["odd-id"] == "o"
    for job_id, prefix in short.items():
        assert registry.get(prefix).job_id == job_id


def test_fit_cuts_only_shrinkable_columns_and_counts_wide_characters() -> None:
    columns = [Column("ID", 0, required=True, min_width=4), Column("STATE", 1, required=True),
               Column("N", 3, right=True), Column("NOTE", 2, min_width=6), Column("EMPTY", 4)]
    rows = [["abcdefgh", "succeeded", "7", "数据集 missing\tagain", ""], ["ab", "lost", "12", "", ""]]
    assert fit(columns, rows, None) == ["ID        STATE       N  NOTE" + " " * 18 + "EMPTY",
                                        "abcdefgh  succeeded   7  数据集 missing again",
                                        "ab        lost       12"]
    narrow = fit(columns, rows, 30)  # NOTE outranks N; EMPTY (no content) goes first
    assert narrow == ["ID        STATE      NOTE", "abcdefgh  succeeded  数据集 m…", "ab        lost"]
    assert all(cell_len(line) <= 30 for line in narrow)
    tiny = fit(columns, rows, 16)  # only the required columns; the id is cut, the state never
    assert tiny == ["ID     STATE", "abcd…  succeeded", "ab     lost"]
    assert truncate("数据集", 4) == "数…" and truncate("abc", 3) == "abc" and truncate("abc", 0) == ""


METRICS = """import json, os, sys
with open(os.path.join(os.environ["ORCH_JOB_DIR"], "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": 5, "total_steps": 10, "loss": 0.5, "tokens_per_s": 1234.0}) + "\\n")
if sys.argv[1] != "0":
    raise RuntimeError("the data loader ran out of shards at epoch 2 while prefetching batch 17")
"""
# Job ids of 49 characters (name-yyyymmdd-hhmmss-4hex), shown as their shortest unique prefix:
# 43 or 44 characters, 46 when two were submitted in the same second (47 or 48 when their hex
# digits start alike) — 80 columns leave REASON at least its 12 (STATE, STEP and gaps take 20).
LONG_NAME = "tiny-lora-warmup-cosine-sw-b"


def test_status_fits_80_100_160_columns_through_the_cli(orch: Orch) -> None:
    """Real jobs of a long name, one failed: every row fits, REASON is there even at 80
    columns (cut with "…"; its log pointer and one-node rank head left out), succeeded jobs
    show their step total, and `orch status JOB` prints the whole reason within the width."""
    jobs = []
    for code in (0, 0, 3):
        spec = write_job(orch.cwd, LONG_NAME, "local", ["python", "m.py", str(code)])
        (orch.cwd / "ws" / "m.py").write_text(METRICS)
        proc = orch("submit", str(spec), "--follow", "--json", check=1 if code else 0)
        jobs.append(re.search(r'"job_id": "([^"]+)"', proc.stdout).group(1))
    states = ["succeeded", "succeeded", "failed"]
    reason = orch.json("status", jobs[2])["reason"]
    assert "RuntimeError: the data loader ran out of shards" in reason and reason.startswith("rank 0 on node 0: ")
    in_table = table_reason(reason, 1)
    assert in_table.startswith("RuntimeError: the data loader") and "orch logs" not in in_table
    for width in (80, 100, 160):
        out = orch("status", env={"COLUMNS": str(width)}).stdout
        lines = out.splitlines()
        assert len(lines) == 4 and all(cell_len(line) <= width for line in lines), out
        headers = lines[0].split()
        assert {"JOB", "STATE", "STEP", "REASON"} <= set(headers) and "ETA" not in headers, out  # ETA: all ended
        for line, job, state in zip(lines[1:], jobs, states):
            short = line.split()[0]
            assert job.startswith(short) and len(short) < len(job) and line.split()[1] == state, out
            assert (" 10/10" if state == "succeeded" else " 5/10 ") in f"{line} ", out  # a succeeded job: its total
            if "LOSS" in headers:
                assert " 0.5000" in line, out
            if width == 80:
                assert orch.json("status", short)["job_id"] == job  # the shown prefix works as an id
        shown = lines[3][lines[0].index("REASON"):]
        cut = shown.endswith("…") and len(shown) >= 12 and in_table.startswith(shown[:-1])
        assert shown == in_table or cut, out
        if width == 160:
            assert {"TOK/S", "ELAPSED", "LOSS"} <= set(headers), out
        watched = orch("status", "-w", "--iterations", "1", env={"COLUMNS": str(width)}).stdout
        assert watched.splitlines() == lines  # -w renders the same table (finished jobs: nothing moves)

    one = orch("status", jobs[2], env={"COLUMNS": "80"}).stdout.splitlines()
    assert all(cell_len(line) <= 80 for line in one) and "REASON" not in one[0] and one[1].split()[1] == "failed"
    detail = one[2:]
    assert detail[0].startswith("reason: ") and len(detail) > 1
    assert all(line.startswith("  ") for line in detail[1:])
    assert " ".join(line.strip() for line in detail) == f"reason: {reason}"  # whole, wrapped at 80
    assert len(orch("status", jobs[0], env={"COLUMNS": "80"}).stdout.splitlines()) == 2  # no reason: the row alone

    wide = orch("status", "--wide", env={"COLUMNS": "80"}).stdout.splitlines()
    assert wide[0].split() == ALL_HEADERS and [line.split()[0] for line in wide[1:]] == jobs
    assert wide[3].endswith(reason)  # --wide: the reason as the server said it
    orch.env.pop("COLUMNS", None)
    assert orch("ls").stdout.splitlines() == wide  # piped without COLUMNS: whole rows for scripts


def test_an_ambiguous_prefix_lists_its_matches(orch: Orch) -> None:
    orch.home.mkdir(parents=True, exist_ok=True)
    registry = Registry(orch.home)
    ids = [f"tiny-lora-20261129-1015{k:02d}-00{k:02d}" for k in range(11)] + ["tiny-other-20261129-101500-0000"]
    for job_id in [*ids, "pair-20261129-101500-aaaa", "pair-20261129-101500-bbbb"]:
        registry.add(job_id, "n", "s", ["local"], "/j", "pending")
    proc = orch("logs", "tiny", check=2)
    assert proc.stderr.strip() == ("error: 'tiny' matches several jobs (12): " + ", ".join(ids[:8])
                                   + ", and 4 more; give more of the id")
    proc = orch("cancel", "tiny-lora-20261129-10150", check=2)
    assert proc.stderr.strip() == ("error: 'tiny-lora-20261129-10150' matches several jobs (10): "
                                   + ", ".join(ids[:8]) + ", and 2 more; give more of the id")
    proc = orch("show", "pair", check=2)
    assert proc.stderr.strip() == ("error: 'pair' matches several jobs (2): pair-20261129-101500-aaaa, "
                                   "pair-20261129-101500-bbbb; give more of the id")


def test_a_wanted_width_is_taken_before_less_important_columns_when_it_fits() -> None:
    columns = [Column("ID", 0, required=True), Column("WHY", 1, min_width=6, want_width=12),
               Column("N", 2, right=True)]
    rows = [["a", "a long reason to cut", "7"]]
    assert fit(columns, rows, 18) == ["ID  WHY", "a   a long reason…"]  # WHY at its want: no room left for N
    assert fit(columns, rows, 14) == ["ID  WHY      N", "a   a long…  7"]  # the want does not fit: the minimum, N too
    assert fit(columns, [["a", "short", "7"]], 12) == ["ID  WHY    N", "a   short  7"]  # never wider than natural

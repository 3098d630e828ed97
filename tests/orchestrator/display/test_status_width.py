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
    (80, ["JOB", "STATE", "STEP", "LOSS", "ETA"]),  # no room for 12 cells of reason: LOSS and ETA kept
    (100, ["JOB", "STATE", "STEP", "LOSS", "ETA", "REASON"]),  # the reason cut, before ETA
    (145, ALL_HEADERS),
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
    if width in (100, 145):  # the reason cut to fit, with "…"
        shown = lines[3][lines[0].index("REASON"):]
        assert shown.endswith("…") and len(shown) > 8 and rows[2].reason.startswith(shown[:-1]), lines[3]


def _mixed_rows(reasons: bool) -> list[StatusRow]:
    """What a screen of `orch status` holds: a running one-node job with a loss (short name), a
    running two-node job on two hosts with a price, a failed job of a long name (its reason
    long, its rank head and log pointer shortened away), a queued job waiting for GPUs and a
    silent supervisor's job; ``reasons=False``: the same rows without their reasons."""
    def row(job_id: str, status: dict, nodes: int, hosts: list[str], reason: str) -> StatusRow:
        return StatusRow(job_id, row_fields(status, 0.0, nodes, None, 1.98 if nodes > 1 else None, now=900.0),
                         hosts, reason if reasons else "")
    metrics = {"step": 420, "total_steps": 1000, "loss": 2.3456, "tokens_per_s": 5321.0, "time": 800.0}
    return [
        row("tiny-20261205-101500-1a2b", {"state": "running", "started": 0.0, "metrics": metrics}, 1, ["local"], ""),
        row("llama-ft-20261205-101501-77aa", {"state": "running", "started": 0.0, "metrics": metrics}, 2,
            ["a100", "a100-2"], ""),
        row("tiny-lora-warmup-cosine-sw-b-20261205-101502-0f0f",
            {"state": "failed", "started": 0.0, "ended": 700.0, "metrics": {"step": 5, "total_steps": 10, "loss": 0.5}},
            1, ["local"], "rank 0 on node 0: RuntimeError: the data loader ran out of shards at epoch 2 while "
                          "prefetching batch 17; full log: orch logs tiny-lora-warmup-cosine-sw-b-20261205-101502-0f0f"),
        row("big-20261205-101503-0000", {"state": "queued", "started": 0.0}, 2, ["a100", "a100-2"],
            "waiting for 2 GPU(s); busy with other processes: GPU 0"),
        row("tiny-20261205-101504-2c3d", {"state": "running", "started": 0.0, "not_answering_s": 43.0, "metrics": metrics},
            1, ["local"], "supervisor not answering for 43 s: stopped (SIGSTOP or SIGTSTP; kill -CONT 4242 on the host "
                          "resumes it)"),
    ]


def test_a_reason_is_cut_before_any_data_column_is_left_out_at_every_width() -> None:
    """Issue 39 item 7: at every width from 60 to 120, beside the reasons, STEP and LOSS are
    there whenever they are without them; a data column is left out for REASON only when REASON
    is down to what its 12 cells need (it could not be cut further to keep that column); when
    not even 12 cells are left REASON is left out alone; every line fits."""
    rows, bare = _mixed_rows(reasons=True), _mixed_rows(reasons=False)
    assert rows[4].progress.state == "running (not answering)"
    order = sorted(STATUS_COLUMNS[:-1], key=lambda c: c.priority)
    shown_at = []
    for width in range(60, 121):
        lines, without = status_lines(rows, width), status_lines(bare, width)
        assert all(cell_len(line) <= width for line in lines + without), (width, "\n".join(lines))
        _assert_fits(lines, width, [r.progress.state for r in rows])
        headers, plain = _header(lines), [h for h in _header(without) if h != "REASON"]
        assert {"STEP", "LOSS"} & set(plain) <= set(headers) and (width < 80 or "LOSS" in headers), width
        if "LOSS" in headers:
            assert " 2.3456" in lines[1] and " 0.5000" in lines[3], (width, "\n".join(lines))
        missing = [c for c in order if c.header in plain and c.header not in headers]
        if "REASON" not in headers:
            assert headers == plain, (width, headers, plain)  # not shown: costs nothing
            continue
        shown_at.append(width)
        start = lines[0].index("REASON")
        reason_width = width - start
        assert reason_width >= 12 and lines[1][start:] == "", (width, "\n".join(lines))
        if missing:  # the reason could not be cut further to keep the first column it left out
            first = missing[0].header
            need = max(cell_len(first), *(cell_len(line[without[0].index(first):].split()[0]) for line in without[1:]
                                          if len(line) > without[0].index(first) and line[without[0].index(first):].strip()))
            assert reason_width - 12 < len("  ") + need, (width, first, "\n".join(lines))
        for line, row in zip(lines[3:], rows[2:]):
            cell, whole = line[start:], table_reason(row.reason, row.progress.nodes)
            assert cell == whole or (cell.endswith("…") and whole.startswith(cell[:-1])), (width, line)
        assert lines[3][start:].startswith("RuntimeErro")
    assert shown_at and shown_at == list(range(shown_at[0], 121)), shown_at  # once there, kept as it widens
    assert shown_at[0] <= 90


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
# digits start alike) — 80 columns leave LOSS and ELAPSED beside them, not REASON's 12 cells.
LONG_NAME = "tiny-lora-warmup-cosine-sw-b"


def test_status_fits_80_100_160_columns_through_the_cli(orch: Orch) -> None:
    """Real jobs of a long name, one failed: every row fits, LOSS is there at 80 columns
    and REASON from 100 (cut with "…"; its log pointer and one-node rank head left out), succeeded jobs
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
        assert {"JOB", "STATE", "STEP", "LOSS"} <= set(headers) and "ETA" not in headers, out  # ETA: all ended
        assert ("REASON" in headers) == (width > 80), out  # 80: no 12 cells left beside LOSS (issue 39 item 7)
        for line, job, state in zip(lines[1:], jobs, states):
            short = line.split()[0]
            assert job.startswith(short) and len(short) < len(job) and line.split()[1] == state, out
            assert (" 10/10" if state == "succeeded" else " 5/10 ") in f"{line} ", out  # a succeeded job: its total
            assert " 0.5000" in line, out  # every row's loss, the failed one's too
            if width == 80:
                assert orch.json("status", short)["job_id"] == job  # the shown prefix works as an id
        if "REASON" in headers:
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


def test_a_skippable_column_that_does_not_fit_costs_the_others_nothing() -> None:
    columns = [Column("ID", 0, required=True), Column("WHY", 1, min_width=6, skippable=True),
               Column("N", 2, right=True)]
    rows = [["a", "a long reason to cut", "7"]]
    assert fit(columns, rows, 9) == ["ID  N", "a   7"]  # WHY's 6 do not fit: left out, N still taken
    assert fit(columns, rows, 14) == ["ID  WHY      N", "a   a long…  7"]
    assert fit([*columns[:1], Column("WHY", 1, min_width=6), columns[2]], rows, 9) == ["ID", "a"]  # not skippable

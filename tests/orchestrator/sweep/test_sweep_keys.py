"""The pure parts of sweeps: flags and block values read as YAML scalars, key paths, the
combinations a job file makes, the status table fitted to 80 columns, the legend labels."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.display.plot import legend_labels
from orchestrator.errors import SpecError, UsageError
from orchestrator.spec.load import parse_spec
from orchestrator.spec.sweepkeys import check_key, parse_flag, short_keys
from orchestrator.state.registry import SUBMITTING, Registry, SweepEntry
from orchestrator.sweep.expand import axes_of, expand, parse_only
from orchestrator.sweep.status import SweepRow, combinations_of, members, summary_line, sweep_lines

TRAIN = """\
name: tiny
hosts: [a, b, c]
train:
  model: m
  data: {train: t.jsonl}
  lr: 2.0e-4          # the base value
sweep:
  train.lr: [1e-4, 3e-4]
  train.lora.r: [8, 16]
"""


def loaded(text: str = TRAIN) -> object:
    return parse_spec(text, Path("job.yaml"))


def test_flag_values_are_yaml_scalars_and_env_values_text() -> None:
    assert parse_flag("train.lr=1e-4,3e-4") == ("train.lr", ((1e-4, "1e-4"), (3e-4, "3e-4")))
    assert parse_flag("train.lora.r=8, 16") == ("train.lora.r", ((8, "8"), (16, "16")))
    assert parse_flag("train.packing=true,false")[1] == ((True, "true"), (False, "false"))
    assert parse_flag("train.max_steps=null,10")[1][0] == (None, "null")
    assert parse_flag("train.model='1e-4'")[1] == (("1e-4", "'1e-4'"),)  # quoted: text
    assert parse_flag("env.LR=1e-4,true")[1] == (("1e-4", "1e-4"), ("true", "true"))
    assert parse_flag("launch.command.3=0.5")[1] == (("0.5", "0.5"),)
    assert parse_flag('env.TAGS=[a, "b,c"]')[1] == (("a", "a"), ("b,c", "b,c"))
    for bad, words in [("train.lr", "KEY=VALUE1"), ("train.lr=1,,2", "empty value"), ("hosts=a", "hosts cannot"),
                       ("train..lr=1", "not a dotted path"), ("env.A.B=1", "env.NAME"), ("train.x=[1", "YAML list")]:
        with pytest.raises(ValueError, match=words):
            parse_flag(bad)
    assert check_key("launch.command.2") == "launch.command.2"


def test_short_keys_keep_keys_apart() -> None:
    assert short_keys(["train.lr", "train.lora.r"]) == {"train.lr": "lr", "train.lora.r": "r"}
    assert short_keys(["launch.command.3", "env.LR"]) == {"launch.command.3": "command.3", "env.LR": "LR"}
    assert short_keys(["train.lora.dropout", "train.dropout"]) == {"train.lora.dropout": "lora.dropout",
                                                                   "train.dropout": "train.dropout"}


def test_block_and_flags_make_the_product_round_robin_over_the_pool() -> None:
    spec = loaded()
    axes = axes_of(spec, ["train.lora.r=4,8", "train.warmup_steps=0"])  # replaces r, adds warmup
    assert [(a.key, a.origin) for a in axes] == [("train.lr", None), ("train.lora.r", "--sweep train.lora.r"),
                                                 ("train.warmup_steps", "--sweep train.warmup_steps")]
    combos = expand(spec, axes, [], "s")
    assert [(c.index, c.host, c.label) for c in combos] == [
        (1, "a", "train.lr=1e-4, train.lora.r=4, train.warmup_steps=0"),
        (2, "b", "train.lr=1e-4, train.lora.r=8, train.warmup_steps=0"),
        (3, "c", "train.lr=3e-4, train.lora.r=4, train.warmup_steps=0"),
        (4, "a", "train.lr=3e-4, train.lora.r=8, train.warmup_steps=0")]
    third = combos[2].loaded
    assert third.spec.train.lr == 3e-4 and third.spec.train.lora.r == 4 and third.spec.sweep is None
    again = parse_spec(third.text, Path("job.yaml")).spec  # the recorded text is that job, alone
    assert again == third.spec and [h for h in again.hosts] == ["c"]
    assert third.text.startswith("# orch sweep s: combination 3 of 4 on c: train.lr=3e-4, train.lora.r=4")
    assert "#   lr: 2.0e-4          # the base value" in third.text  # the file as written, below


def test_a_bad_value_names_the_combination_the_field_and_where_it_was_given() -> None:
    spec = loaded(TRAIN.replace("[1e-4, 3e-4]", "[1e-4, abc]"))
    with pytest.raises(SpecError) as err:
        expand(spec, axes_of(spec, []), [], "s")
    assert str(err.value).splitlines() == [
        "job.yaml:8:20: combination 3 (train.lr=abc, train.lora.r=8): train.lr: must be a number > 0 (got 'abc')",
        "job.yaml:8:20: combination 4 (train.lr=abc, train.lora.r=16): train.lr: must be a number > 0 (got 'abc')"]
    with pytest.raises(SpecError) as err:
        expand(spec, axes_of(spec, ["train.lora.r=8,0"]), [], "s")
    assert "--sweep train.lora.r: combination 2 (train.lr=1e-4, train.lora.r=0): train.lora.r: must be a positive " \
           "integer (got 0)" in str(err.value)
    with pytest.raises(SpecError, match=r"^--sweep train.lrr: every combination: train.lrr: unknown field "
                                        r"\(did you mean 'lr'\?\)$"):
        expand(loaded(), axes_of(loaded(), ["train.lrr=1,2"]), [], "s")


@pytest.mark.parametrize("flag, words", [
    ("launch.command.9=x", "launch.command has 2 item(s): there is no index 9"),
    ("launch.command.x=1", "launch.command is a list: name an item by its index"),
    ("train.lr=1", "the job has no train: section (it runs launch.command)"),
    ("outputs.0.x=1", "outputs.0 is text in the job file, not a mapping or a list"),
    ("workspace.exclude.0=x", "workspace cannot be swept"),
    ("on_finish.shutdown_command.0=x", "on_finish.shutdown_command is not a list written in the job file"),
])
def test_paths_into_lists_and_missing_sections_are_refused_clearly(flag: str, words: str) -> None:
    spec = loaded("name: own\nhosts: [a]\nlaunch:\n  command: [python, t.py]\noutputs: [out/]\n")
    with pytest.raises((SpecError, UsageError), match=words.replace("(", r"\(").replace(")", r"\)")):
        expand(spec, axes_of(spec, [flag]), [], "s")


def test_multi_node_jobs_are_swept_only_on_slurm_hosts() -> None:
    spec = loaded(TRAIN.replace("  lr: 2.0e-4          # the base value", "  lr: 2.0e-4\nlaunch: {nnodes: 2}"))
    with pytest.raises(SpecError, match="a sweep of multi-node jobs needs Slurm hosts"):
        expand(spec, axes_of(spec, []), [], "s")
    assert len(expand(spec, axes_of(spec, []), [], "s", frozenset({"a", "b", "c"}))) == 4


def test_overlapping_repeated_and_too_many_keys_are_usage_errors() -> None:
    for flags, words in [(["train.lora=1", "train.lora.r=2"], "inside it"), (["env.A=1", "env.A=2"], "given twice"),
                         (["env.A=" + ",".join(map(str, range(20))), "env.B=" + ",".join(map(str, range(20)))],
                          "at most 256"), (["env.A=1,1"], "more than once")]:
        with pytest.raises(UsageError, match=words):
            axes_of(loaded("name: own\nhosts: [a]\nlaunch: {command: [x]}\n"), flags)


def test_the_sweep_status_fits_80_columns_and_sums_up() -> None:
    keys = ["train.lr", "train.lora.r", "env.SOME_RATHER_LONG_NAME"]
    rows = [SweepRow(i, [v, str(r), "a-long-value-of-text"], state, "box" if i % 2 else "box2", "12/12", 2.5 / i,
                     1.0 + 1 / i if state == "succeeded" else None, f"tiny-20261201-1200{i:02d}-abc{i}")
            for i, (v, r, state) in enumerate([("1e-4", 8, "succeeded"), ("1e-4", 16, "succeeded"),
                                               ("3e-4", 8, "running"), ("3e-4", 16, "failed")], start=1)]
    lines = sweep_lines(keys, rows, 80, [])
    assert all(len(line) <= 80 for line in lines)
    assert lines[0].split()[:6] == ["#", "lr", "r", "SOME_RATHER_LONG_NAME", "STATE", "BEST"]
    assert lines[1].split()[:5] == ["1", "1e-4", "8", "a-long-value-of-text", "succeeded"]
    assert lines[-1] == "4 combinations: 2 succeeded, 1 running, 1 failed; best eval 1.5000 (#2)"
    assert sweep_lines(keys, rows, None, [])[1].endswith("tiny-20261201-120001-abc1")  # --wide: whole ids


def test_legend_labels_are_the_varied_values_of_one_sweep_else_job_ids() -> None:
    entries = {f"j{i}": SweepEntry("s", i, 2, [["train.lr", lr, text], ["train.lora.r", 8, "8"]])
               for i, (lr, text) in enumerate([(1e-4, "1e-4"), (3e-4, "3e-4")], start=1)}
    assert legend_labels(["j1", "j2"], entries) == (["lr=1e-4, r=8", "lr=3e-4, r=8"], "sweep s")
    assert legend_labels(["j1", "other"], entries)[1] is None


def test_a_combination_is_counted_once_and_those_never_started_are_named(tmp_path: Path) -> None:
    registry = Registry(tmp_path)
    values = [["env.X", "a", "a"]]
    for job_id, state, combination in [("t-1", SUBMITTING, 1), ("t-2", "succeeded", 1), ("t-3", SUBMITTING, 2)]:
        registry.add(job_id, "t", "job.yaml", ["box"], f"/jobs/{job_id}", state,
                     sweep=SweepEntry("s", combination, 4, values))
    found = members(registry, "s")  # the reservation cut off, then the job started for it elsewhere: one row
    assert [(r.job_id, e.combination) for r, e in found] == [("t-2", 1), ("t-3", 2)] and combinations_of(found) == 4
    rows = [SweepRow(e.combination, ["a"], r.state, "box", "", None, None, r.job_id) for r, e in found]
    assert summary_line(rows, 4) == "4 combinations: 1 succeeded, 1 submitting, 2 not started"
    assert registry.forget_reservation("t-3") and not registry.forget_reservation("t-2")  # only a reservation goes
    assert [r.job_id for r, _ in members(registry, "s")] == ["t-2"]
    assert parse_only("2, 4,6-8") == frozenset({2, 4, 6, 7, 8})

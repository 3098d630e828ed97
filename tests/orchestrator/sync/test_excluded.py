"""What the ignore rules leave out: each path with the rule that decided (file:line and
pattern), the precedence of .gitignore, .orchignore and workspace.exclude, the per-rule summary
`orch submit` prints, the .orchignore line that brings a path back (tried against the real
selection), and a failed job's missing-file reason explained on the laptop."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.sync import excluded, selection


def files(root: Path, rels: dict[str, int]) -> Path:
    """``root`` holding each of ``rels`` with that many bytes."""
    for rel, size in rels.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x" * size)
    return root


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A nanoGPT-like workspace: .gitignore has `*.bin` on line 6 (after a comment and blank
    lines, which must not shift the numbers), `__pycache__/` and `out/`."""
    root = files(tmp_path / "ws", {"train.py": 10, "model.py": 10, "data/synth/prepare.py": 10,
                                   "data/synth/train.bin": 3 << 20, "data/synth/val.bin": 1 << 20,
                                   "__pycache__/model.cpython-311.pyc": 100, "out/ckpt.pt": 2 << 20,
                                   "out/logs/a.txt": 5})
    (root / ".gitignore").write_text("# nanoGPT\n__pycache__/\n\nout/\n\n*.bin\n")
    return root


def chosen(root: Path, exclude: list[str] | None = None) -> tuple[set[str], selection.Skipped]:
    skipped = selection.Skipped()
    return set(selection.select_files(root, exclude or [], skipped)), skipped


def test_each_path_left_out_is_recorded_with_the_rule_that_decided(ws: Path) -> None:
    picked, skipped = chosen(ws, ["model.py"])
    assert picked == {".gitignore", "train.py", "data/synth/prepare.py"}
    rules = skipped.rules
    assert rules is not None
    found = {e.rel: (str(rules.rule(e.rule)), e.size) for e in skipped.excluded}
    assert found == {
        "__pycache__/": (".gitignore:2 '__pycache__/'", 0),
        "out/": (".gitignore:4 'out/'", 0),
        "data/synth/train.bin": (".gitignore:6 '*.bin'", 3 << 20),
        "data/synth/val.bin": (".gitignore:6 '*.bin'", 1 << 20),
        "model.py": ("workspace.exclude[0] 'model.py'", 10),
    }


def test_later_rules_win_orchignore_negates_gitignore_and_workspace_exclude_has_the_last_word(ws: Path) -> None:
    (ws / ".orchignore").write_text("!data/synth/*.bin\n")
    picked, _ = chosen(ws)
    assert {"data/synth/train.bin", "data/synth/val.bin"} <= picked
    picked, skipped = chosen(ws, ["data/synth/val.bin"])
    assert "data/synth/train.bin" in picked and "data/synth/val.bin" not in picked
    assert skipped.rules is not None
    val = next(e for e in skipped.excluded if e.rel == "data/synth/val.bin")
    assert str(skipped.rules.rule(val.rule)) == "workspace.exclude[0] 'data/synth/val.bin'"


def test_a_file_under_an_excluded_folder_cannot_be_negated_alone(ws: Path) -> None:
    """gitignore semantics: a folder left out is never entered, so `!data/synth/train.bin`
    does nothing while `data/` excludes the folder; the fix offered re-includes the folder."""
    (ws / ".gitignore").write_text("data/\n")
    (ws / ".orchignore").write_text("!data/synth/train.bin\n")
    picked, skipped = chosen(ws)
    assert not any(p.startswith("data/") for p in picked)
    assert skipped.rules is not None
    found = excluded.why(skipped.rules, "data/synth/train.bin")
    assert found is not None and found.at == "data/" and found.fix == ("!/data/",)
    assert found.text() == ("data/synth/train.bin is not synced: its folder data/ is excluded by .gitignore:1 'data/'; "
                            "add '!/data/' to .orchignore")


@pytest.mark.parametrize("gitignore, orchignore, exclude, rel, fix, drop", [
    ("*.bin\n", "", [], "data/synth/train.bin", ("!data/synth/*.bin",), ()),
    ("secret.py\n", "", [], "secret.py", ("!/secret.py",), ()),
    ("*.bin\n", "", [], "top.bin", ("!/*.bin",), ()),
    ("synth/\n", "", [], "data/synth", ("!data/synth/",), ()),
    ("synth/\n", "", [], "data/synth/train.bin", ("!data/synth/",), ()),
    ("data/\n*.bin\n", "", [], "data/synth/train.bin", ("!/data/", "!data/synth/*.bin"), ()),
    ("", "data/\n", [], "data/synth/train.bin", ("!/data/",), ()),
    ("", "", ["*.bin"], "data/synth/train.bin", (), ("*.bin",)),
    ("*.bin\n", "", ["data/"], "data/synth/train.bin", ("!data/synth/*.bin",), ("data/",)),
    ("[ab]*.bin\n", "", [], "da[t]a/a b.bin", ("!da\\[t]a/*.bin",), ()),
    ("x*\n", "", [], "x[1] y", ("!/x\\[1] y",), ()),
])
def test_the_fix_offered_brings_the_path_back(tmp_path: Path, gitignore: str, orchignore: str, exclude: list[str],
                                               rel: str, fix: tuple[str, ...], drop: tuple[str, ...]) -> None:
    """Applied as advised (the lines appended to .orchignore, the patterns taken out of
    workspace.exclude), the selection then holds the path."""
    root = files(tmp_path / "ws", {rel if not rel.endswith("synth") else rel + "/x.txt": 3, "keep.py": 1})
    (root / ".gitignore").write_text(gitignore)
    (root / ".orchignore").write_text(orchignore)
    is_dir = (root / rel).is_dir()
    found = excluded.why(selection.IgnoreRules(root, exclude), rel, is_dir)
    assert found is not None and (found.fix, found.drop) == (fix, drop)
    with (root / ".orchignore").open("a") as f:
        f.write("".join(line + "\n" for line in found.fix))
    picked, _ = chosen(root, [p for p in exclude if p not in found.drop])
    assert any(p == rel or p.startswith(rel + "/") for p in picked)
    assert excluded.why(selection.IgnoreRules(root, [p for p in exclude if p not in found.drop]), rel, is_dir) is None


def test_a_git_folder_is_never_synced_and_no_line_changes_that(tmp_path: Path) -> None:
    root = files(tmp_path / "ws", {".git/config": 3, "a.py": 1})
    found = excluded.why(selection.IgnoreRules(root, []), ".git/config")
    assert found is not None and found.rule is None and found.fix == ()
    assert "a .git folder is never synced" in found.text()


def test_the_summary_counts_files_and_bytes_per_rule_and_names_the_largest_folders(ws: Path) -> None:
    _, skipped = chosen(ws)
    summary = excluded.summarize(ws, skipped)
    assert summary.complete and (summary.files, summary.folders) == (5, 2)
    assert [(str(t.rule), t.files, t.bytes, t.folders) for t in summary.rules] == [
        (".gitignore:6 '*.bin'", 2, 4 << 20, 0), (".gitignore:4 'out/'", 2, (2 << 20) + 5, 1),
        (".gitignore:2 '__pycache__/'", 1, 100, 1)]
    assert [(f.path, f.bytes) for f in summary.largest] == [("data/synth/", 4 << 20), ("out/", (2 << 20) + 5),
                                                            ("__pycache__/", 100)]
    lines = summary.lines()
    assert lines == ["left out by ignore rules: 5 file(s), 6.0 MB",
                     "  .gitignore:6 '*.bin': 2 file(s), 4.0 MB",
                     "  .gitignore:4 'out/': 2 file(s), 2.0 MB, 1 folder(s)",
                     "  .gitignore:2 '__pycache__/': 1 file(s), 0.0 MB, 1 folder(s)",
                     "  largest: data/synth/ 4.0 MB, out/ 2.0 MB"]
    data = summary.as_json()
    assert data["rules"][0] == {"rule": ".gitignore:6 '*.bin'", "source": ".gitignore", "line": 6, "pattern": "*.bin",
                                "files": 2, "bytes": 4 << 20, "folders": 0}
    assert data["largest"][0] == {"path": "data/synth/", "files": 2, "bytes": 4 << 20}


def test_the_summary_stays_short_and_narrow(tmp_path: Path) -> None:
    rels = {f"d{i}/{'x' * 60}.tmp{i}": i + 1 for i in range(8)}
    root = files(tmp_path / "ws", {**rels, "a.py": 1})
    (root / ".gitignore").write_text("".join(f"*.tmp{i}\n" for i in range(8)) + "/" + "y" * 70 + "/\n")
    _, skipped = chosen(root)
    lines = excluded.summarize(root, skipped).lines()
    assert len(lines) <= 6 and all(len("orch: " + line) <= 80 for line in lines)
    assert "+5 more rule(s)" in lines[4]


def test_nothing_left_out_says_nothing(tmp_path: Path) -> None:
    root = files(tmp_path / "ws", {"a.py": 1})
    _, skipped = chosen(root)
    assert excluded.summarize(root, skipped).lines() == []


def test_sizing_excluded_folders_is_bounded_and_says_so(tmp_path: Path) -> None:
    root = files(tmp_path / "ws", {**{f".venv/lib/m{i}.py": 10 for i in range(50)}, "a.py": 1})
    (root / ".gitignore").write_text(".venv/\n")
    _, skipped = chosen(root)
    whole = excluded.summarize(root, skipped)
    assert whole.complete and whole.files == 50 and whole.bytes == 500
    cut = excluded.summarize(root, skipped, budget=20)
    assert not cut.complete and cut.files < 50
    assert cut.lines()[0].startswith("left out by ignore rules: at least ")


REASON = ("rank 0 on node 0: FileNotFoundError: [Errno 2] No such file or directory: 'data/synth/train.bin' "
          "(exit code 1); full log: orch logs JOB")


@pytest.mark.parametrize("reason, expected", [
    (REASON, "data/synth/train.bin"),
    ("rank 0 on node 0: python: can't open file '/r/jobs/J/code/data/synth/val.bin': [Errno 2] No such file or "
     "directory (exit code 2)", "data/synth/val.bin"),
    ('rank 0 on node 0: OSError: No such file or directory: "./data/synth/train.bin"', "data/synth/train.bin"),
    ("rank 1 on node 0: FileNotFoundError: Unable to open 'data/synth/train.bin' (exit code 1)",
     "data/synth/train.bin"),
])
def test_a_failure_on_an_excluded_file_names_the_file_the_rule_and_the_fix(ws: Path, reason: str,
                                                                             expected: str) -> None:
    found = excluded.explain_failure(reason, "/r/jobs/J", ws, [])
    assert found is not None and found.rel == expected
    assert found.text() == f"{expected} is excluded by .gitignore:6 '*.bin'; add '!data/synth/*.bin' to .orchignore"


@pytest.mark.parametrize("reason", [
    # not on the laptop:
    "rank 0 on node 0: FileNotFoundError: [Errno 2] No such file or directory: 'data/synth/nope.bin'",
    "rank 0 on node 0: FileNotFoundError: [Errno 2] No such file or directory: 'train.py'",  # synced
    "rank 0 on node 0: FileNotFoundError: [Errno 2] No such file or directory: '/r/jobs/J/data/synth/train.bin'",
    "rank 0 on node 0: FileNotFoundError: [Errno 2] No such file or directory: '/etc/data/synth/train.bin'",
    "rank 0 on node 0: FileNotFoundError: [Errno 2] No such file or directory: '../ws/data/synth/train.bin'",
    "rank 0 on node 0: ValueError: 'data/synth/train.bin' is odd",  # not a missing file
    "rank 0 on node 0 exited with code 3",
])
def test_other_failures_are_not_explained(ws: Path, reason: str) -> None:
    assert excluded.explain_failure(reason, "/r/jobs/J", ws, []) is None


def test_a_failed_status_is_explained_from_the_recorded_job_file(ws: Path) -> None:
    spec = ws.parent / "job.yaml"
    spec.write_text("name: nano\nhosts: [local]\nworkspace: {path: ws}\nlaunch:\n  command: python train.py\n")
    status = {"state": "failed", "reason": REASON, "exit_code": 1}
    shown = excluded.explained_status(status, "/r/jobs/J", str(spec))
    assert shown["reason"] == ("data/synth/train.bin is excluded by .gitignore:6 '*.bin'; add '!data/synth/*.bin' to "
                               f".orchignore — {REASON}")
    assert shown["excluded"] == {"path": "data/synth/train.bin", "excluded_at": "data/synth/train.bin",
                                 "rule": ".gitignore:6 '*.bin'", "fix": ["!data/synth/*.bin"],
                                 "advice": "add '!data/synth/*.bin' to .orchignore"}
    assert excluded.explained_status(shown, "/r/jobs/J", str(spec)) == shown  # once only
    assert excluded.explained_status(dict(status, state="running"), "/r/jobs/J", str(spec))["reason"] == REASON
    assert excluded.explained_status(status, "/r/jobs/J", str(ws / "gone.yaml")) == status


def test_a_huge_excluded_folder_does_not_starve_the_others(tmp_path: Path) -> None:
    root = files(tmp_path / "ws", {**{f".venv/m{i}.py": 1 for i in range(200)}, "data/big.bin": 5 << 20, "a.py": 1})
    (root / ".gitignore").write_text(".venv/\ndata/\n")
    _, skipped = chosen(root)
    summary = excluded.summarize(root, skipped, budget=40)
    assert not summary.complete
    assert summary.largest[0] == excluded.Folder("data/", 1, 5 << 20)


def test_a_folder_brought_back_can_be_narrowed_as_in_git(tmp_path: Path) -> None:
    """README's recipe: `!/data/` brings the folder back, then `data/*` and `!data/synth/` keep
    only data/synth/ of it."""
    root = files(tmp_path / "ws", {"data/synth/train.bin": 1, "data/other/x.bin": 1, "data/top.txt": 1, "a.py": 1})
    (root / ".gitignore").write_text("data/\n")
    (root / ".orchignore").write_text("!data/synth/train.bin\n")
    assert chosen(root)[0] == {".gitignore", ".orchignore", "a.py"}
    (root / ".orchignore").write_text("!/data/\ndata/*\n!data/synth/\n")
    assert chosen(root)[0] == {".gitignore", ".orchignore", "a.py", "data/synth/train.bin"}


def test_only_the_top_level_gitignore_is_read_and_anchoring_follows_gitignore(tmp_path: Path) -> None:
    root = files(tmp_path / "ws", {"sub/a.txt": 1, "sub/data/x.csv": 1, "data/y.csv": 1, "deep/__pycache__/m.pyc": 1})
    (root / "sub" / ".gitignore").write_text("*.txt\n")
    (root / ".gitignore").write_text("/data/\n__pycache__/\n")
    assert chosen(root)[0] == {".gitignore", "sub/.gitignore", "sub/a.txt", "sub/data/x.csv"}

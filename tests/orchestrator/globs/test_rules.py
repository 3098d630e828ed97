"""Each gitignore rule of orchestrator/globs/, by hand: what a line means (read.py) and how a
list decides (match.py), with the two places orch follows git rather than pathspec (a class
never matches '/', a newline is an ordinary character); and the automaton's bounds — a
pattern with many wildcards against a long name, and a list whose sets of states would
explode, run with the remembered sets capped and still decide right."""

from __future__ import annotations

import random

import pytest

from orchestrator.globs import match
from orchestrator.globs.match import Patterns, Verdict
from orchestrator.globs.read import PatternError, read
from tests.orchestrator.globs.test_differential import compare


def matches(lines: list[str], path: str) -> bool:
    return Patterns(lines).match(path)


def test_a_pattern_without_a_slash_matches_at_any_depth_and_one_with_a_slash_is_anchored() -> None:
    assert matches(["*.pyc"], "a.pyc") and matches(["*.pyc"], "x/y/a.pyc")
    assert matches(["frotz"], "a/b/frotz") and matches(["frotz"], "frotz/inner.txt")
    assert matches(["doc/frotz"], "doc/frotz") and not matches(["doc/frotz"], "a/doc/frotz")
    assert matches(["/build"], "build") and not matches(["/build"], "src/build")
    assert matches(["doc/frotz"], "doc/frotz/deeper/file")  # everything below a matched folder


def test_a_trailing_slash_matches_folders_and_everything_below_them_never_a_file() -> None:
    rules = Patterns(["build/"])
    assert rules.match("build/") and rules.match("build/x.o") and rules.match("a/build/x.o")
    assert not rules.match("build") and not rules.match("a/build")


def test_the_last_matching_line_decides_and_a_negation_brings_a_path_back() -> None:
    assert Patterns(["*.log", "!keep.log"]).check("a/keep.log") == Verdict(False, 1)
    assert Patterns(["!keep.log", "*.log"]).check("a/keep.log") == Verdict(True, 1)
    assert Patterns(["*.log", "!keep.log"]).check("other.log") == Verdict(True, 0)
    assert Patterns(["*.log"]).check("a.txt") == Verdict(None, None)


def test_a_match_of_the_path_itself_overrules_a_match_through_a_folder_whatever_the_order() -> None:
    """pathspec's GitIgnoreSpec (and so orch's sync since it began): a file pattern, even an
    earlier one, beats a folder pattern that matches only through a folder above the path."""
    assert Patterns(["data/", "!data/keep.txt"]).check("data/keep.txt") == Verdict(False, 1)
    assert Patterns(["!keep.txt", "build/"]).check("build/keep.txt") == Verdict(False, 0)
    assert Patterns(["!keep.txt", "build/"]).check("build/other.txt") == Verdict(True, 1)
    assert Patterns(["logs", "!logs/"]).check("logs/") == Verdict(False, 1)


def test_double_stars_at_the_start_the_middle_and_the_end() -> None:
    assert matches(["**/foo"], "foo") and matches(["**/foo"], "a/b/foo")
    assert matches(["a/**/b"], "a/b") and matches(["a/**/b"], "a/x/y/b") and not matches(["a/**/b"], "x/a/b")
    assert matches(["abc/**"], "abc/x") and matches(["abc/**"], "abc/x/y") and not matches(["abc/**"], "abc")
    assert matches(["a**b"], "axxb") and not matches(["a**b"], "a/b")  # not a whole segment: two stars


def test_stars_questions_and_classes_never_cross_a_slash() -> None:
    assert matches(["a*b"], "axyb") and not matches(["a*b"], "ax/yb")
    assert matches(["a?b"], "axb") and not matches(["a?b"], "a/b")
    assert not matches(["foo/*"], "foo/") and matches(["foo/*"], "foo/x")  # a lone * needs one character
    assert matches(["a[!x]b"], "ayb") and not matches(["a[!x]b"], "a/b")  # git: never '/' (pathspec: yes)
    assert not matches(["a[+-0]b"], "a/b") and matches(["a[+-0]b"], "a.b")  # a range over '/' skips it


def test_classes_read_as_gitignore_writes_them() -> None:
    assert matches(["[abc]"], "b") and not matches(["[abc]"], "d")
    assert matches(["[a-c]x"], "bx") and not matches(["[a-c]x"], "dx")
    assert matches(["[!a]"], "b") and matches(["[^a]"], "b") and not matches(["[^a]"], "a")
    assert matches(["[]a]"], "]") and matches(["[!]a]"], "b") and not matches(["[!]a]"], "]")
    assert matches(["[a-]"], "-") and matches(["[-a]"], "-")
    assert matches(["[\\]"], "\\")  # a backslash inside a class is a member
    assert Patterns(["[ab", "x"]).check("[ab") == Verdict(None, None)  # an unclosed class: the line does nothing
    assert Patterns(["[ab", "x"]).check("x") == Verdict(True, 1)  # ... and still counts


def test_escapes_trailing_spaces_and_comments() -> None:
    assert matches(["\\*"], "*") and not matches(["\\*"], "x")
    assert matches(["\\#notes"], "#notes") and matches(["\\!bang"], "!bang")
    assert matches(["foo  "], "foo") and not matches(["foo  "], "foo ")  # trailing spaces dropped
    assert matches(["foo\\ "], "foo ") and not matches(["foo\\ "], "foo")  # ... unless the last is escaped
    assert matches([" foo"], " foo") and not matches([" foo"], "foo")  # leading ones kept
    rules = Patterns(["# a comment", "#x", "x"])
    assert rules.check("#x") == Verdict(None, None) and rules.check("x") == Verdict(True, 2)
    assert Patterns(["/"]).check("a") == Verdict(None, None)


def test_paths_are_read_as_pathspec_read_them() -> None:
    assert matches(["/a"], "./a") and matches(["/a"], "/a")
    assert Patterns(["", "a", "", "b"]).check("b") == Verdict(True, 1)  # empty lines are not counted


def test_a_newline_in_a_name_is_an_ordinary_character() -> None:
    assert matches(["a*b"], "a\nb") and matches(["x/**/y"], "x/\n/y") and not matches(["foo"], "foo\n")


def test_lines_that_are_not_patterns_are_refused_with_the_reason() -> None:
    with pytest.raises(PatternError, match="lone backslash"):
        read("foo\\")
    with pytest.raises(PatternError, match="range z-a"):
        read("[z-a]")
    with pytest.raises(PatternError, match="nothing follows the '!'"):
        read("!")
    with pytest.raises(PatternError) as caught:
        Patterns(["ok", "", "#", "bad\\"])
    assert caught.value.index == 2  # among the non-empty lines


def test_many_wildcards_against_a_long_name_decide_in_one_pass() -> None:
    """What stalled pathspec for hours: here each character is one move of the automaton."""
    rules = Patterns(["*a*a*a*a*a*a*a*a*b", "**/a/**/a/**/a/**/a/**/a/**/b"])
    assert rules.check("a" * 250) == Verdict(None, None)
    assert rules.check("a" * 249 + "b") == Verdict(True, 0)
    deep = "/".join(["a"] * 2000)
    assert rules.check(deep) == Verdict(None, None) and rules.check(deep + "/b") == Verdict(True, 1)


def test_the_remembered_sets_stay_capped_and_the_answers_right(monkeypatch: pytest.MonkeyPatch) -> None:
    """``*a??????????b`` needs a set of states per last-12-characters pattern (4096 of them);
    with the cap at 8 every few characters the sets are forgotten and built again."""
    monkeypatch.setattr(match, "MAX_SETS", 8)
    lines = ["*a??????????b", "!*b*b", "x/"]
    rules = Patterns(lines)
    rng = random.Random(7)
    paths = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 40))) for _ in range(300)]
    paths += ["x/" + p for p in paths[:50]]
    assert compare(lines, paths) == len(paths)
    for path in paths:
        rules.check(path)
        assert len(rules._sets) <= 8

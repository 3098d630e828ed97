"""orch's linear-time gitignore matcher (orchestrator/globs/) decides exactly as pathspec's
GitIgnoreSpec decided — the same deciding line (index) and the same verdict — on every small
pattern over a small alphabet against every short path, and on generated lists of patterns
against generated paths; a line pathspec refuses is refused. Where pathspec departs from git
on purpose of ours (a class never matches '/', a newline is an ordinary character) the pairs
that would show it are left out here and tested by hand in test_rules.py."""

from __future__ import annotations

import itertools
import re
import warnings

import pathspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.globs.match import Patterns, Verdict
from orchestrator.globs.read import Kind, PatternError


def oracle(lines: list[str]) -> pathspec.GitIgnoreSpec | None:
    """pathspec's spec of ``lines``, or None where pathspec refuses one."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pathspec's classes make re warn of "possible set operations"
        try:
            return pathspec.GitIgnoreSpec.from_lines(lines)
        except (ValueError, re.error):  # GitIgnorePatternError is a ValueError
            return None


def slash_class(patterns: Patterns) -> bool:
    """Whether a line holds a class that pathspec's regex would let match '/'."""
    return any(step.kind is Kind.CLASS
               and (("/" in step.members or any(lo <= "/" <= hi for lo, hi in step.ranges)) != step.negated)
               for glob in patterns.globs for step in glob.steps)


def compare(lines: list[str], paths: list[str]) -> int:
    """Assert both matchers agree on ``paths``; the number of paths compared."""
    spec = oracle(lines)
    if spec is None:
        with pytest.raises(PatternError):
            Patterns(lines)
        return 0
    mine = Patterns(lines)
    skip_slashed = slash_class(mine)
    n = 0
    for path in paths:
        if skip_slashed and "/" in (path[1:] if path.startswith("/") else path):
            continue
        theirs = spec.check_file(path)
        assert mine.check(path) == Verdict(theirs.include, theirs.index), (lines, path)
        n += 1
    return n


PATHS = ["".join(p) for n in range(1, 5) for p in itertools.product("ab/", repeat=n)] + \
    ["a.b", "a/b.c", "x/a/b", "a/b/", "./a", "/a/b", "ab/ab/ab", "b/a/b/a/", "aa/a/a", "a/ba/b/", "a//a/"]


def test_every_short_pattern_over_a_small_alphabet_decides_as_pathspec_did() -> None:
    """All patterns of up to 4 characters of a, *, ?, /, !, [, ], \\ and a space (10,000 lines)
    against all paths of up to 4 characters of a, b, / (120 paths) and a few more."""
    count = 0
    for n in range(1, 5):
        for chars in itertools.product("a*?/![]\\ ", repeat=n):
            count += compare(["".join(chars)], PATHS)
    assert count > 500_000


def test_short_patterns_with_classes_ranges_escapes_and_comments() -> None:
    alphabet = ["a", "b", "[", "]", "!", "^", "-", "\\", "*", "#", "/", "z"]
    paths = ["a", "b", "z", "ab", "ba", "a/b", "b/a", "a/", "z/a/", "-", "]", "^", "\\", "#", "!", "[", "#a", "!a",
             "a-b", "a]b", "[a]", "*", "a/*", "]a", "a\\", "^a", "a/a/a", "//"]
    for n in range(1, 5):
        for chars in itertools.product(alphabet, repeat=n):
            compare(["".join(chars)], paths)


def patterns(parts: list[str], names: list[str]) -> st.SearchStrategy[list[str]]:
    segment = st.lists(st.sampled_from(parts), min_size=1, max_size=3).map("".join)
    line = st.tuples(st.sampled_from(["", "", "!", "/", "!/", "**/", "\\!", "#"]),
                     st.lists(segment, min_size=1, max_size=4).map("/".join),
                     st.sampled_from(["", "", "/", "/**", " ", "\\ ", "/*"])).map("".join)
    return st.lists(line, min_size=1, max_size=8)


def paths(names: list[str]) -> st.SearchStrategy[list[str]]:
    path = st.tuples(st.sampled_from(["", "", "./", "/"]),
                     st.lists(st.sampled_from(names), min_size=1, max_size=6).map("/".join),
                     st.sampled_from(["", "/"])).map("".join)
    return st.lists(path, min_size=1, max_size=12)


# few letters: most lines match most paths, so lines compete and the list's rule decides
TIGHT = (["a", "b", "*", "?", "**", "[ab]", "[!a]", "[a-b]", "\\a", "a*", "*b"], ["a", "b", "ab", "ba", "aa"])
# more of what a line can hold: dots, escapes of every kind, brackets as members, spaces
RICH = (["a", "b", ".", "*", "?", "**", "[ab]", "[!a]", "[a-c]", "[]a]", "\\*", "\\[", "x", "a*", "*b", "?a", "[.]"],
        ["a", "b", ".", "x", "*", "ab", "aa", "c", "[", "]", " ", "!", "a.b"])


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(patterns(*TIGHT), paths(TIGHT[1]))
def test_generated_lists_of_competing_patterns_decide_as_pathspec_did(lines: list[str], paths: list[str]) -> None:
    """Lists of lines over two letters (negations, anchors, folders, ** in every position,
    classes, trailing spaces) against paths of up to six segments, folders with their /."""
    compare(lines, paths)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(patterns(*RICH), paths(RICH[1]))
def test_generated_lists_of_varied_patterns_decide_as_pathspec_did(lines: list[str], paths: list[str]) -> None:
    compare(lines, paths)

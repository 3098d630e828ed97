"""One gitignore-style pattern line read into steps over a path's characters.

The reading is the one ``pathspec`` (``GitIgnoreSpecPattern``, 1.1) gives the same line, so a
pattern means here what it meant when orch matched with that library: trailing spaces dropped
unless the last one is escaped (``\\ ``); a blank line, a ``#`` comment and a lone ``/`` are
no-ops; a leading ``!`` negates; ``\\x`` is ``x`` literally; a pattern without a ``/`` but a
trailing one matches at any depth, one with a ``/`` is anchored at the top; a trailing ``/``
makes a folder pattern (it matches what lies under the folder, never a file of that name);
``**`` is a whole segment at the start (any leading folders), in the middle (zero or more
folders) or at the end (everything below); ``*`` is any run of characters but ``/`` (a
segment that is ``*`` alone needs at least one); ``?`` one character but ``/``; ``[...]`` a
class with ``!`` or ``^`` negation and ranges, read as Python's ``re`` read the class pathspec
built (a leading ``]`` is a member, a backslash is a member, a ``-`` first or last is a
member). A class with no closing ``]`` makes the whole line a no-op. Two deliberate
differences, both git's behaviour: a class never matches ``/`` (pathspec's ``[!a]`` did), and
a newline in a name is an ordinary character (pathspec's ``.`` and ``$`` treated it apart).

Nothing here builds a regular expression: ``read`` returns steps (``Step``) that
``globs/match.py`` runs as an automaton. A line that cannot be read (a trailing lone
backslash, a range whose ends are reversed, a ``!`` with nothing after it) raises
``PatternError`` naming the line and why.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class PatternError(ValueError):
    """A pattern line that is not a pattern; ``str()`` names the line and what is wrong
    (``reason``); ``index``: the line's index in a list of lines (``globs.match.Patterns``)."""

    def __init__(self, message: str, reason: str = "", index: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason or message
        self.index = index


class Kind(enum.Enum):
    CHAR = "char"  # one given character
    ANY = "any"  # ? : one character but '/'
    STAR = "star"  # * : zero or more characters but '/'
    CLASS = "class"  # [...] : one character of a class, never '/'
    LEAD = "lead"  # a leading **/ : nothing, or one or more characters (any, '/' too) and a '/'
    MID = "mid"  # a middle /** : nothing, or a '/' and one or more characters (any)


@dataclass(frozen=True)
class Step:
    """One step of a pattern over a path's characters: ``char`` for CHAR; for CLASS its
    single ``members``, its inclusive ``ranges`` and ``negated``."""

    kind: Kind
    char: str = ""
    members: frozenset[str] = frozenset()
    ranges: tuple[tuple[str, str], ...] = ()
    negated: bool = False

    def takes(self, c: str) -> bool:
        """Whether this one-character step (ANY or CLASS) takes ``c``."""
        if c == "/":
            return False
        if self.kind is Kind.ANY:
            return True
        inside = c in self.members or any(lo <= c <= hi for lo, hi in self.ranges)
        return inside != self.negated


class End(enum.Enum):
    """What a match of the steps needs after them, and how firmly it decides (pathspec's
    priority: a match of a folder pattern is overruled by any other pattern's match of the
    path itself, whichever comes later)."""

    NAME = "name"  # the path ends there (decides firmly), or goes on with '/' (a folder above it: weakly)
    BELOW = "below"  # a '/' follows (anything under it), firmly: a trailing /** of a non-folder pattern
    FOLDER = "folder"  # a '/' follows, weakly: a folder pattern's trailing /


class Whole(enum.Enum):
    """Lines pathspec matches without steps: ``**`` and ``*`` (any non-empty path, firmly),
    ``**/*/**`` (any path with a '/', firmly), ``**/`` and ``*/`` (any path with a '/', weakly)."""

    ANY = "any"
    SLASHED = "slashed"
    SLASHED_FOLDER = "slashed-folder"


@dataclass(frozen=True)
class Glob:
    """One line read: ``negated`` for a ``!`` line; ``noop`` lines (blank, comment, a lone
    ``/``, an unclosed class) match nothing; otherwise ``whole`` or ``steps`` anchored at the
    path's start followed by ``end``."""

    line: str
    negated: bool = False
    noop: bool = False
    steps: tuple[Step, ...] = ()
    end: End = End.NAME
    whole: Whole | None = None


class _Unclosed(Exception):
    """A ``[`` without its ``]``: the whole line is a no-op (git discards it)."""


def read(line: str) -> Glob:
    """``line`` read as a gitignore pattern (module docstring); raises ``PatternError``."""
    text = line if line.endswith("\\ ") else line.rstrip()
    if not text or text.startswith("#") or text == "/":
        return Glob(line, noop=True)
    negated = text.startswith("!")
    if negated:
        text = text[1:]
    segs = text.split("/")
    folder = not segs[-1]
    if not segs[0]:
        del segs[0]  # a leading '/': anchored at the top
    elif len(segs) == 1 or (len(segs) == 2 and not segs[1]):
        if segs[0] != "**":
            segs.insert(0, "**")  # no '/' but a trailing one: at any depth
    if not segs:
        raise PatternError(f"{line!r} is not a pattern: nothing follows the '!'", "nothing follows the '!'")
    if not segs[-1]:
        segs[-1] = "**"  # a trailing '/': what lies under the folder
    for i in range(len(segs) - 1, 0, -1):
        if segs[i - 1] == "**" and segs[i] == "**":
            del segs[i]
    whole = _whole(segs, folder)
    if whole is not None:
        return Glob(line, negated, whole=whole)
    try:
        steps, end = _steps(segs, folder)
    except _Unclosed:
        return Glob(line, negated, noop=True)
    except PatternError as exc:
        raise PatternError(f"{line!r} is not a pattern: {exc}", str(exc)) from None
    return Glob(line, negated, steps=steps, end=end)


def _whole(segs: list[str], folder: bool) -> Whole | None:
    if segs == ["**"]:
        return Whole.SLASHED_FOLDER if folder else Whole.ANY
    if segs == ["**", "*"]:
        return Whole.ANY
    if segs == ["**", "*", "**"]:
        return Whole.SLASHED_FOLDER if folder else Whole.SLASHED
    return None


def _steps(segs: list[str], folder: bool) -> tuple[tuple[Step, ...], End]:
    steps: list[Step] = []
    end = End.NAME
    slash = False
    last = len(segs) - 1
    for i, seg in enumerate(segs):
        if seg == "**":
            if i == 0:
                steps.append(Step(Kind.LEAD))
            elif i < last:
                steps.append(Step(Kind.MID))
                slash = True
            else:
                end = End.FOLDER if folder else End.BELOW
            continue
        if slash:
            steps.append(Step(Kind.CHAR, "/"))
        steps += [Step(Kind.ANY), Step(Kind.STAR)] if seg == "*" else _segment(seg)
        slash = True
    return tuple(steps), end


def _segment(seg: str) -> list[Step]:
    """One path segment's glob (no '/' in it) as steps."""
    out: list[Step] = []
    i, n = 0, len(seg)
    while i < n:
        c = seg[i]
        i += 1
        if c == "\\":
            if i == n:
                raise PatternError("it ends in a lone backslash (write \\\\ for a backslash)")
            out.append(Step(Kind.CHAR, seg[i]))
            i += 1
        elif c == "*":
            out.append(Step(Kind.STAR))
        elif c == "?":
            out.append(Step(Kind.ANY))
        elif c == "[":
            step, i = _class(seg, i)
            out.append(step)
        else:
            out.append(Step(Kind.CHAR, c))
    return out


def _class(seg: str, i: int) -> tuple[Step, int]:
    """The class opened by the ``[`` before ``seg[i]``, and the index past its ``]``."""
    n = len(seg)
    j = i
    if j < n and seg[j] in "!^":
        j += 1
    if j < n and seg[j] == "]":
        j += 1
    while j < n and seg[j] != "]":
        j += 1
    if j >= n:
        raise _Unclosed()
    negated = seg[i] in "!^"
    body = seg[i + 1 if negated else i:j]
    members: set[str] = set()
    ranges: list[tuple[str, str]] = []
    k = 0
    while k < len(body):
        lo = body[k]
        k += 1
        if k < len(body) and body[k] == "-":
            if k + 1 == len(body):  # a '-' before the closing ']' is a member
                members.update((lo, "-"))
                break
            hi = body[k + 1]
            k += 2
            if hi < lo:
                raise PatternError(f"the range {lo}-{hi} in [{seg[i:j]}] runs backwards")
            ranges.append((lo, hi))
        else:
            members.add(lo)
    return Step(Kind.CLASS, members=frozenset(members), ranges=tuple(ranges), negated=negated), j + 1

"""A list of gitignore-style patterns matched against paths in time linear in the path.

``Patterns(lines)`` reads each line (``globs/read.py``) and joins them into one automaton whose
states are bits of a Python int; a path is run through it one character at a time, and a set
of states already met is remembered with its moves (a DFA built lazily, as RE2 does), so a
typical path costs one dictionary look-up per character. No regular expression runs, nothing
backtracks: a path of n characters costs at most n steps of the automaton, each bounded by the
number of states (about the patterns' total length), whatever the patterns are — the bound
that keeps ``*a*a*a*a*a*a*b``, or a ``**/a/**/a/**/b`` against a deep server-supplied name,
from stalling ``orch submit`` and ``orch fetch``. The remembered sets are capped
(``MAX_SETS``); past the cap they are forgotten and built again, so memory stays bounded too.

The list decides as pathspec's ``GitIgnoreSpec`` (1.1) did: of the lines that match a path
firmly (the path itself, or everything below a ``/**``), the last decides; if none does, the
last that matches it weakly (through a folder above it, or a folder pattern) decides. A
``!`` line that decides means "not matched". ``check`` says which line decided, by its index
among the non-empty lines given (comments and other no-ops count, as pathspec counted them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from orchestrator.globs.read import End, Glob, Kind, PatternError, Step, Whole, read

MAX_SETS = 4096  # remembered sets of states, each with its moves, before they are all forgotten


@dataclass(frozen=True)
class Verdict:
    """What the patterns say of one path: ``index`` of the deciding line (``None``: no line
    matched) and ``matched`` — True for a plain line, False for a ``!`` line, None for none."""

    matched: bool | None
    index: int | None


class _Node:
    """One state of the automaton: its moves on one character (``chars``: a given one;
    ``slashless``: any but '/'; ``anything``: any; ``classes``: a class step's test)."""

    __slots__ = ("chars", "slashless", "anything", "classes", "eps")

    def __init__(self) -> None:
        self.chars: dict[str, int] = {}
        self.slashless = 0
        self.anything = 0
        self.classes: list[tuple[Step, int]] = []
        self.eps = 0  # states reached without a character


class _Set:
    """A set of states met while running a path (a DFA state): its moves, filled on demand,
    and the verdict of a path that ends in it."""

    __slots__ = ("states", "moves", "verdict")

    def __init__(self, states: int) -> None:
        self.states = states
        self.moves: dict[str, _Set] = {}
        self.verdict: Verdict | None = None


class Patterns:
    """``lines`` (the empty ones dropped, as pathspec dropped them) compiled once; ``globs[i]``
    is the line at index ``i``. Raises ``read.PatternError`` (with the line's ``index``) for a
    line that is not a pattern."""

    def __init__(self, lines: Iterable[str]) -> None:
        globs: list[Glob] = []
        for line in lines:
            if line:
                try:
                    globs.append(read(line))
                except PatternError as exc:
                    raise PatternError(str(exc), exc.reason, len(globs)) from None
        self.globs: tuple[Glob, ...] = tuple(globs)
        self._nodes: list[_Node] = []
        self._firm: dict[int, int] = {}  # state bit -> the index of the line it decides for, firmly
        self._weak: dict[int, int] = {}  # ... weakly
        start = 0
        for index, glob in enumerate(self.globs):
            if not glob.noop:
                start |= self._add(index, glob)
        self._closure = [0] * len(self._nodes)
        for n in range(len(self._nodes) - 1, -1, -1):  # epsilon moves only go to later states
            self._closure[n] = self._reach(n)
        self._start_states = self._close(start)
        self._sets: dict[int, _Set] = {}
        self._start = self._known(self._start_states)

    def match(self, path: str) -> bool:
        """Whether the deciding line for ``path`` is a plain (not ``!``) line."""
        return bool(self.check(path).matched)

    def check(self, path: str) -> Verdict:
        """The verdict for ``path`` (POSIX, relative; one leading ``/`` or ``./`` is dropped; a
        folder written with its trailing ``/`` is matched as a folder)."""
        if path.startswith("/"):
            path = path[1:]
        elif path.startswith("./"):
            path = path[2:]
        at = self._start
        for c in path:
            at = at.moves.get(c) or self._move(at, c)
        if at.verdict is None:
            at.verdict = self._verdict(at.states)
        return at.verdict

    # building

    def _node(self) -> int:
        self._nodes.append(_Node())
        return len(self._nodes) - 1

    def _add(self, index: int, glob: Glob) -> int:
        """Add ``glob``'s states; return the bit of its first state."""
        first = self._node()
        if glob.whole is not None:
            sink = self._sink(index, firm=glob.whole is not Whole.SLASHED_FOLDER)
            if glob.whole is Whole.ANY:
                self._nodes[first].anything |= 1 << sink
            else:  # anywhere a '/' is met
                self._nodes[first].anything |= 1 << first
                self._nodes[first].chars["/"] = 1 << sink
            return 1 << first
        at = first
        for step in glob.steps:
            at = self._step(at, step)
        sink = self._sink(index, firm=glob.end is End.BELOW)
        self._nodes[at].chars["/"] = self._nodes[at].chars.get("/", 0) | 1 << sink
        if glob.end is End.NAME:
            self._firm[1 << at] = index  # the path ends here
        return 1 << first

    def _sink(self, index: int, firm: bool) -> int:
        """A state that, once reached, stays: the line matched whatever follows."""
        sink = self._node()
        self._nodes[sink].anything |= 1 << sink
        (self._firm if firm else self._weak)[1 << sink] = index
        return sink

    def _step(self, at: int, step: Step) -> int:
        """Add ``step`` after state ``at``; return the state after it."""
        node = self._nodes[at]
        kind = step.kind
        if kind is Kind.STAR:
            after = self._node()
            node.slashless |= 1 << at
            node.eps |= 1 << after
            return after
        if kind is Kind.LEAD:  # (?:.+/)?
            inner, after = self._node(), self._node()
            node.eps |= 1 << after
            node.anything |= 1 << inner
            self._nodes[inner].anything |= 1 << inner
            self._nodes[inner].chars["/"] = 1 << after
            return after
        if kind is Kind.MID:  # (?:/.+)?
            slash, inner, after = self._node(), self._node(), self._node()
            node.eps |= 1 << after
            node.chars["/"] = node.chars.get("/", 0) | 1 << slash
            self._nodes[slash].anything |= 1 << inner
            self._nodes[inner].anything |= 1 << inner
            self._nodes[inner].eps |= 1 << after
            return after
        after = self._node()
        if kind is Kind.CHAR:
            node.chars[step.char] = node.chars.get(step.char, 0) | 1 << after
        elif kind is Kind.ANY:
            node.slashless |= 1 << after
        else:
            node.classes.append((step, 1 << after))
        return after

    def _reach(self, n: int) -> int:
        """State ``n`` and every state its epsilon moves reach (later states' closures known)."""
        return 1 << n | self._close(self._nodes[n].eps)

    # running

    def _close(self, states: int) -> int:
        """``states`` and every state their epsilon moves reach."""
        out = 0
        while states:
            low = states & -states
            out |= self._closure[low.bit_length() - 1]
            states ^= low
        return out

    def _known(self, states: int) -> _Set:
        found = self._sets.get(states)
        if found is None:
            if len(self._sets) >= MAX_SETS:  # forget every set and its moves: memory stays bounded
                for old in self._sets.values():
                    old.moves.clear()
                self._sets.clear()
                self._start = self._sets[self._start_states] = _Set(self._start_states)
                if states == self._start_states:
                    return self._start
            found = self._sets[states] = _Set(states)
        return found

    def _move(self, at: _Set, c: str) -> _Set:
        """The set after ``c`` from ``at``, remembered in ``at.moves``."""
        nxt = 0
        states = at.states
        nodes = self._nodes
        while states:
            low = states & -states
            states ^= low
            node = nodes[low.bit_length() - 1]
            nxt |= node.anything | node.chars.get(c, 0)
            if c != "/":
                nxt |= node.slashless
                for step, target in node.classes:
                    if step.takes(c):
                        nxt |= target
        found = self._known(self._close(nxt))
        at.moves[c] = found
        return found

    def _verdict(self, states: int) -> Verdict:
        firm = [i for bit, i in self._firm.items() if states & bit]
        weak = [i for bit, i in self._weak.items() if states & bit]
        decided = max(firm) if firm else max(weak) if weak else None
        if decided is None:
            return Verdict(None, None)
        return Verdict(not self.globs[decided].negated, decided)

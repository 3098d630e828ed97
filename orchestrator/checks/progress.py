"""``launch.progress`` checked on the laptop for what would make the server switch it off.

The server searches the pattern only in a worker process, each log line under
``userpattern.LINE_BUDGET_S`` of CPU, and switches it off for the job at the first line that
blows that (remote_payload/contract/userpattern.py): a catastrophic pattern never stalls the
supervisor, but the job loses its progress rows. Here, before anything connects:

- the pattern is tried in the same kind of worker on short hostile lines (40 of one
  character it can match: ``xxxx…``, ``0000…``, spaces; each also with a NUL after it): one that blows the budget on such a
  line is refused (``SpecError``, exit 2, ``file:line:col``), naming the line and, where it
  has one, the repeat inside a repeat that makes it exponential;
- a repeat inside a repeat (``(x+)+``, ``(\\w+\\s?)*``) that does not blow up on those lines is
  warned about: a longer or other line may still make it exponential.

Standard library only (``re``'s own parser); no engine beyond Python's, so what passes here is
what the server runs.
"""

from __future__ import annotations

import functools
import re
import sys
from typing import Any, Iterable

from orchestrator.errors import SpecError
from orchestrator.spec.load import LoadedSpec
from remote_payload.contract.userpattern import LINE_BUDGET_S, PatternWorker

try:  # Python 3.11 moved re's parser; sre_parse is its name in 3.10
    from re import _constants as sre_constants  # type: ignore[attr-defined]
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

END = "\x00"  # after the run of one character: a line that almost matches
HOSTILE_LENGTH = 40  # characters of the lines tried: 2**40 steps for a nested repeat of one character
MAX_CHARS = 16  # distinct characters tried
SHOWN = 60  # characters of a construct named in a message
_C = sre_constants
_REPEATS = {_C.MAX_REPEAT, _C.MIN_REPEAT}
_CATEGORY_TEXT = {_C.CATEGORY_DIGIT: "\\d", _C.CATEGORY_NOT_DIGIT: "\\D", _C.CATEGORY_WORD: "\\w",
                  _C.CATEGORY_NOT_WORD: "\\W", _C.CATEGORY_SPACE: "\\s", _C.CATEGORY_NOT_SPACE: "\\S"}
_CATEGORY_CHAR = {_C.CATEGORY_DIGIT: "0", _C.CATEGORY_NOT_DIGIT: "a", _C.CATEGORY_WORD: "a",
                  _C.CATEGORY_NOT_WORD: " ", _C.CATEGORY_SPACE: " ", _C.CATEGORY_NOT_SPACE: "a"}
_AT_TEXT = {_C.AT_BEGINNING: "^", _C.AT_BEGINNING_STRING: "\\A", _C.AT_END: "$", _C.AT_END_STRING: "\\Z",
            _C.AT_BOUNDARY: "\\b", _C.AT_NON_BOUNDARY: "\\B"}


def progress_problems(loaded: LoadedSpec) -> list[str]:
    """Warnings about ``launch.progress`` (``file:line:col: launch.progress: ...``); raises
    ``SpecError`` for a pattern that blows the server's budget on a short hostile line."""
    pattern = loaded.spec.launch.progress
    if not pattern:
        return []
    where = f"{loaded.locate(('launch', 'progress'))}: launch.progress"
    try:
        tree = sre_parse.parse(pattern)
    except Exception:  # noqa: BLE001 - the spec's validator compiled it; a parser quirk is no finding
        return []
    nested = nested_repeat(tree)
    construct = f" (`{nested}`, a repeat inside a repeat)" if nested else ""
    blown = hostile_line(pattern)
    if blown is not None:
        raise SpecError(
            f"{where}: the pattern{construct} takes more than {LINE_BUDGET_S:g} s of CPU on a line of "
            f"{HOSTILE_LENGTH} {blown[0]!r}{' and a NUL' if blown.endswith(END) else ''}: Python's regular expressions backtrack, and on the server such a line "
            "would switch it off for the job. Write it so each part of a line can match one way only, e.g. "
            "(?P<step>\\d+) rather than (?P<step>(\\d+)+) (docs/own-script.md)")
    if nested:
        return [f"{where}: `{nested}` repeats a repeat: on a line that almost matches it can take exponential "
                f"time; the server gives the pattern {LINE_BUDGET_S:g} s of CPU per line and switches it off for the "
                "job past that (docs/own-script.md)"]
    return []


@functools.lru_cache(maxsize=64)  # a sweep checks each combination: one worker per pattern
def hostile_line(pattern: str) -> str | None:
    """The first of the short hostile lines (``HOSTILE_LENGTH`` of one character the pattern
    can match, then that with END) on which ``pattern`` blows the budget in a worker like the
    server's; None when none does (or no worker could start: the server still bounds it)."""
    tree = sre_parse.parse(pattern)
    worker = PatternWorker(pattern, python=sys.executable)
    try:
        if worker.off is not None:
            return None
        for char in candidate_chars(tree):
            for line in (char * HOSTILE_LENGTH, char * HOSTILE_LENGTH + END):  # the end lets `$` fail
                worker.search_all([line])
                if worker.off is not None:
                    return line if "of CPU" in worker.off else None
        return None
    finally:
        worker.close()


def nested_repeat(tree: Iterable[Any]) -> str | None:
    """The first repeat (``*``, ``+``, ``{m,n}`` with n > 1) whose body holds another such
    repeat, as text (``(x+x+)+``, cut to SHOWN characters); None when there is none."""
    for op, av in tree:
        if op in _REPEATS and av[1] > 1:
            if _holds_repeat(av[2]):
                text = _text([(op, av)])
                return text if len(text) <= SHOWN else text[:SHOWN - 1] + "…"
            found = nested_repeat(av[2])
        else:
            found = next((f for f in map(nested_repeat, _children(op, av)) if f), None)
        if found:
            return found
    return None


def _holds_repeat(tree: Iterable[Any]) -> bool:
    return any((op in _REPEATS and av[1] > 1) or any(_holds_repeat(c) for c in _children(op, av)) for op, av in tree)


def _children(op: Any, av: Any) -> list[Any]:
    """The sub-patterns under one node (a group's, a branch's alternatives, a lookaround's)."""
    if op is _C.SUBPATTERN:
        return [av[-1]]
    if op is _C.BRANCH:
        return list(av[1])
    if op in (_C.ASSERT, _C.ASSERT_NOT) or op in _REPEATS:
        return [av[-1]]
    return []  # possessive repeats and atomic groups (Python 3.11) never backtrack into themselves


def candidate_chars(tree: Iterable[Any]) -> list[str]:
    """Characters the pattern names (literals, classes' first members, a category's typical
    one), then ``x``, ``0``, space and ``a``; at most MAX_CHARS, each once."""
    chars: list[str] = []

    def walk(nodes: Iterable[Any]) -> None:
        for op, av in nodes:
            if op is _C.LITERAL:
                chars.append(chr(av))
            elif op is _C.IN:
                for item_op, item in av:
                    if item_op is _C.LITERAL:
                        chars.append(chr(item))
                    elif item_op is _C.RANGE:
                        chars.append(chr(item[0]))
                    elif item_op is _C.CATEGORY and item in _CATEGORY_CHAR:
                        chars.append(_CATEGORY_CHAR[item])
            elif op is _C.ANY:
                chars.append("a")
            for child in _children(op, av):
                walk(child)

    walk(tree)
    chars += ["x", "0", " ", "a"]
    return [c for c in dict.fromkeys(chars) if c.isprintable()][:MAX_CHARS]


def _text(tree: Iterable[Any]) -> str:
    """A sub-pattern written back as a regular expression (close to what the user wrote)."""
    return "".join(_node_text(op, av) for op, av in tree)


def _node_text(op: Any, av: Any) -> str:
    if op is _C.LITERAL:
        return re.escape(chr(av))
    if op is _C.NOT_LITERAL:
        return "[^%s]" % re.escape(chr(av))
    if op is _C.ANY:
        return "."
    if op is _C.IN:
        if len(av) == 1 and av[0][0] is _C.CATEGORY:
            return _CATEGORY_TEXT.get(av[0][1], "[…]")
        return "[%s]" % "".join(_in_text(item_op, item) for item_op, item in av)
    if op is _C.SUBPATTERN:
        return "(%s)" % _text(av[-1]) if av[0] is not None else "(?:%s)" % _text(av[-1])
    if op is _C.BRANCH:
        return "|".join(_text(alt) for alt in av[1])
    if op in _REPEATS:
        low, high, body = av
        inner = _text(body)
        if len(body) != 1 or body[0][0] is _C.BRANCH or body[0][0] in _REPEATS:
            inner = "(?:%s)" % inner
        suffix = {(0, _C.MAXREPEAT): "*", (1, _C.MAXREPEAT): "+", (0, 1): "?"}.get(
            (low, high), "{%d,}" % low if high == _C.MAXREPEAT else "{%d,%d}" % (low, high))
        return inner + suffix + ("?" if op is _C.MIN_REPEAT else "")
    if op is _C.AT:
        return _AT_TEXT.get(av, "")
    if op is _C.GROUPREF:
        return "\\%d" % av
    return "…"


def _in_text(op: Any, item: Any) -> str:
    if op is _C.NEGATE:
        return "^"
    if op is _C.LITERAL:
        return re.escape(chr(item))
    if op is _C.RANGE:
        return "%s-%s" % (re.escape(chr(item[0])), re.escape(chr(item[1])))
    if op is _C.CATEGORY:
        return _CATEGORY_TEXT.get(item, "…")
    return "…"

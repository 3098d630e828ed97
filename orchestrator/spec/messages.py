"""Validation and YAML errors of a job file in plain words.

Pure functions used by ``load.py``. Contract: a message says what the field allows ("an
integer from 1 to 1024 or auto", "one of: full, partial, lora"), read from the job's JSON
Schema, and never shows validator internals (regular expressions, ``literal_error``,
``constrained-int``, "Value error, "). A YAML syntax error names where the parser noticed
it and, when it has one, where the unclosed bracket or quote began.
"""

from __future__ import annotations

from typing import Any

import yaml

# Errors about the field's shape or range: answered with what the schema allows.
NOT_SHAPE = {"missing", "extra_forbidden", "value_error", "assertion_error"}
MAX_FIELDS_SHOWN = 5


def data_path(loc: tuple[Any, ...], data: Any, kind: str) -> tuple[Any, ...]:
    """Follow pydantic's ``loc`` through the document, dropping what is not in it: union-member
    names (``constrained-int``, ``literal['auto']``, a host's ``inline``) and ``[key]``. The
    last part is kept for a ``missing`` error: it is the key that is not there."""
    out: list[Any] = []
    node = data
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
            out.append(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
            out.append(part)
        elif i == len(loc) - 1 and kind == "missing":
            out.append(part)
    return tuple(out)


def plain_message(err: dict[str, Any], schema: dict[str, Any], path: tuple[Any, ...],
                  patterns: dict[str, str]) -> str:
    """The message for one pydantic error at document ``path`` (not for unknown fields).
    ``patterns`` says in words what each regular expression of the schema allows."""
    kind = err["type"]
    if kind == "missing":
        return "field required"
    if kind in NOT_SHAPE:
        text = str(err["msg"])
        for prefix in ("Value error, ", "Assertion failed, "):
            text = text.removeprefix(prefix)
        return text
    node = schema_at(schema, path)
    allowed = describe(node, schema, patterns) if node is not None else None
    if allowed is None:  # not found in the schema: the message, minus pydantic's phrasing
        allowed = str(err["msg"]).replace("Input should be ", "").split(",")[0]
    return f"must be {allowed} (got {shown(err.get('input'))})"


def named_field(path: tuple[Any, ...], message: str, marks: dict[tuple[Any, ...], Any]) -> tuple[Any, ...]:
    """The written field a cross-field rule's message starts with (``memory.quantize needs ...``,
    ``finetune: partial needs ...``), as a key path under ``path`` or one of its parents; ``path``
    itself when the message names no field written in the file. Lets the error point at the
    field's own line instead of the section holding it."""
    head = message.split(" ", 1)[0].rstrip(":,")
    parts = tuple(head.split("."))
    if not all(part.isidentifier() for part in parts):
        return path
    return next((path[:n] + parts for n in range(len(path), -1, -1) if path[:n] + parts in marks), path)


def shown(value: Any, limit: int = 40) -> str:
    """A value as YAML would spell it, cut to ``limit`` characters."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = repr(value)
    elif isinstance(value, dict):
        text = "a mapping"
    elif isinstance(value, list):
        text = "an empty list" if not value else "a list"
    else:
        text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return root.get("$defs", {}).get(ref.rsplit("/", 1)[-1], {})
    return node


def schema_at(root: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any] | None:
    """The schema of the value at ``path`` (through $ref, anyOf, items, additionalProperties)."""
    node: dict[str, Any] | None = root
    for part in path:
        node = _step(_resolve(node, root), part, root) if node is not None else None
    return node


def _step(node: dict[str, Any], part: Any, root: dict[str, Any]) -> dict[str, Any] | None:
    for member in node.get("anyOf") or node.get("oneOf") or []:
        found = _step(_resolve(member, root), part, root)
        if found is not None:
            return found
    if isinstance(part, int) and isinstance(node.get("items"), dict):
        return node["items"]
    if isinstance(part, str) and part in node.get("properties", {}):
        return node["properties"][part]
    if isinstance(part, str) and isinstance(node.get("additionalProperties"), dict):
        return node["additionalProperties"]
    return None


def describe(node: dict[str, Any], root: dict[str, Any], patterns: dict[str, str]) -> str:
    """What a schema allows, in words: ``an integer from 1 to 1024 or auto``; a pattern not in
    ``patterns`` is "text in the expected form"."""
    node = _resolve(node, root)
    members = node.get("anyOf") or node.get("oneOf")
    if members:
        resolved = [_resolve(m, root) for m in members]
        ordered = [m for m in resolved if "const" not in m] + [m for m in resolved if "const" in m]
        words = list(dict.fromkeys(describe(m, root, patterns) for m in ordered))
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + ("," if len(words) > 2 else "") + " or " + words[-1]
    if "const" in node:
        return shown(node["const"]).strip("'")
    if "enum" in node:
        return "one of: " + ", ".join(shown(v).strip("'") for v in node["enum"])
    kind = node.get("type")
    if kind in ("integer", "number"):
        return _number(node, kind == "integer")
    if kind == "string":
        if "pattern" in node:
            return patterns.get(node["pattern"], "text in the expected form")
        return "non-empty text" if node.get("minLength", 0) >= 1 else "text"
    if kind == "boolean":
        return "true or false"
    if kind == "null":
        return "null"
    if kind == "array":
        least = node.get("minItems", 0)
        return "a list" + (f" with at least {least} item{'s' if least > 1 else ''}" if least else "")
    fields = list(node.get("properties", {}))
    if fields:
        listed = ", ".join(fields[:MAX_FIELDS_SHOWN]) + (", …" if len(fields) > MAX_FIELDS_SHOWN else "")
        return f"a mapping with fields {listed}"
    return "a mapping of names to text" if kind == "object" else "a valid value"


def _number(node: dict[str, Any], integer: bool) -> str:
    noun = "an integer" if integer else "a number"
    low, high = node.get("minimum"), node.get("maximum")
    xlow, xhigh = node.get("exclusiveMinimum"), node.get("exclusiveMaximum")
    if integer and xlow is not None:  # > 0 on integers reads better as ≥ 1
        low, xlow = int(xlow) + 1, None
    if integer and low == 1 and high is None and xhigh is None:
        return "a positive integer"
    if low is not None and high is not None:
        return f"{noun} from {_num(low)} to {_num(high)}"
    bounds = [f"{op} {_num(v)}" for op, v in ((">", xlow), ("≥", low), ("<", xhigh), ("≤", high)) if v is not None]
    return noun + (" " + " and ".join(bounds) if bounds else "")


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def yaml_problem(exc: yaml.YAMLError, text: str) -> str:
    """``:line:col: invalid YAML: problem (the '[' opened at line 3, column 9 is never closed)``:
    what follows the file name in the message for a YAML syntax error."""
    mark = getattr(exc, "problem_mark", None)
    pos = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    note = ""
    if context and start is not None:
        at = f"line {start.line + 1}, column {start.column + 1}"
        opener = text[start.index] if 0 <= start.index < len(text) else ""
        never_closed = "end of stream" in problem or "<stream end>" in problem or "expected ','" in problem
        if opener and opener in "[{\"'" and never_closed:
            note = f" (the {opener!r} opened at {at} is never closed)"
        elif context.startswith("while "):
            note = f" ({context.removeprefix('while ')} that starts at {at})"
    elif "'\\t'" in problem:
        note = " (indent with spaces: YAML does not allow tabs there)"
    return f"{pos}: invalid YAML: {problem}{note}"

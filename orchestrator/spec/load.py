"""Reading a job file: ``load_spec`` (the only I/O of the spec), YAML composed with the line and
column of every key, and validation errors as ``file:line:col: field.path: message`` lines.

Errors name the field path (``train.lora.r``) and, for an unknown field, the closest known
name; aliases are expanded under a node budget, so an anchor bomb is an error, not a hang.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from orchestrator.errors import SpecError
from orchestrator.spec.messages import data_path, named_field, plain_message, yaml_problem
from orchestrator.spec.model import (
    MAX_DEPTH,
    MAX_NODES,
    MAX_SPEC_BYTES,
    PATTERN_WORDS,
    JobSpec,
    job_schema,
    known_field_names,
)

Marks = dict[tuple[Any, ...], tuple[int, int]]


@dataclass(frozen=True)
class LoadedSpec:
    """A validated spec with where it came from: ``marks`` holds the (line, column) of every
    key path written in the file, ``where`` the file name as the user gave it."""

    spec: JobSpec
    path: Path
    text: str
    marks: Marks = field(default_factory=dict, compare=False, repr=False)
    where: str = ""

    @property
    def workspace_dir(self) -> Path:
        return (self.path.parent / Path(self.spec.workspace.path).expanduser()).resolve()

    def locate(self, key_path: tuple[Any, ...]) -> str:
        """``file:line:col`` of ``key_path``, or of its closest written parent (1:1 if none)."""
        line, col = _mark_of(self.marks, key_path)
        return f"{self.where or self.path}:{line}:{col}"


def _mark_of(marks: Marks, path: tuple[Any, ...]) -> tuple[int, int]:
    return next((marks[path[:n]] for n in range(len(path), -1, -1) if path[:n] in marks), (1, 1))


def load_spec(path: str | Path) -> LoadedSpec:
    """Read and validate a job file. Raises ``SpecError`` (exit 2) with file:line:col."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise SpecError(f"{path}: file is larger than {MAX_SPEC_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    return parse_spec(text, path)


def parse_spec(text: str, path: Path) -> LoadedSpec:
    """Validate job-file ``text`` as if read from ``path`` (errors name that path)."""
    data, marks = parse_yaml(text, str(path))
    if not isinstance(data, dict):
        raise SpecError(f"{path}:1:1: the job file must be a mapping of fields (name, hosts, ...)")
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(format_errors(exc, data, marks, str(path))) from None
    return LoadedSpec(spec=spec, path=path.resolve(), text=text, marks=marks, where=str(path))


def parse_yaml(text: str, where: str) -> tuple[Any, Marks]:
    """Safe-load YAML and record the (line, column) of every key and value by path.

    Aliases are expanded with a node budget, so an anchor bomb is an error, not a hang.
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise SpecError(f"{where}{yaml_problem(exc, text)}") from None
    except (RecursionError, ValueError) as exc:
        raise SpecError(f"{where}: invalid YAML: {exc}") from None
    if root is None:
        raise SpecError(f"{where}:1:1: the job file is empty")
    marks: Marks = {}
    budget = [MAX_NODES]
    constructor = yaml.SafeLoader("")

    def build(node: yaml.Node, path: tuple[Any, ...], depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0 or depth > MAX_DEPTH:
            raise SpecError(f"{where}:{node.start_mark.line + 1}: YAML is too large or too deeply nested")
        marks.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = build(key_node, path + ("<key>",), depth + 1)
                if not isinstance(key, (str, int, float, bool)) and key is not None:
                    line = key_node.start_mark.line + 1
                    raise SpecError(f"{where}:{line}: a mapping key must be a plain value")
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise SpecError(f"{where}:{key_node.start_mark.line + 1}: `<<` merge keys are not supported")
                if key in out:  # YAML would keep the last silently: a pasted block twice, a stray copy
                    first = marks[path + (key, "<key>")][0]
                    line, column = key_node.start_mark.line + 1, key_node.start_mark.column + 1
                    field_name = ".".join(str(p) for p in path + (key,))
                    raise SpecError(f"{where}:{line}:{column}: {field_name}: given twice (first on line {first}); "
                                    "keep one")
                marks[path + (key, "<key>")] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                out[key] = build(value_node, path + (key,), depth + 1)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [build(item, path + (i,), depth + 1) for i, item in enumerate(node.value)]
        try:
            return constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            raise SpecError(f"{where}:{node.start_mark.line + 1}: invalid YAML value: {exc}") from None

    return build(root, (), 0), marks


def format_errors(exc: ValidationError, data: Any, marks: Marks, where: str) -> str:
    """One line per wrong field: ``file:line:col: field.path: message (did you mean 'x'?)``.

    Messages say what is allowed in plain words (``messages.plain_message``), never the
    validator's internals; the errors pydantic reports for each member of a union collapse
    into one line for the field.
    """
    lines = []
    for err in exc.errors(include_url=False):
        kind = err["type"]
        path = data_path(tuple(err["loc"]), data, kind)
        key_mark = marks.get(path + ("<key>",)) if kind == "extra_forbidden" else None
        mark = key_mark or _mark_of(marks, path)
        field_name = ".".join(str(p) for p in path) or "(top level)"
        if kind == "extra_forbidden" and path and isinstance(path[-1], str):
            close = difflib.get_close_matches(path[-1], sorted(known_field_names()), n=1, cutoff=0.6)
            message = "unknown field" + (f" (did you mean '{close[0]}'?)" if close else "")
        else:
            message = plain_message(err, job_schema(), path, PATTERN_WORDS)
            if kind == "value_error" and (named := named_field(path, message, marks)) != path:
                mark, field_name = _mark_of(marks, named), ".".join(str(p) for p in named)
        lines.append(f"{where}:{mark[0]}:{mark[1]}: {field_name}: {message}")
    return "\n".join(dict.fromkeys(lines))

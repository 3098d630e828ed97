"""job.yaml as pydantic models, and ``load_spec`` — the only function here that does I/O.

Errors name ``file:line:column``, the field path (``train.lora.r``) and, for an unknown
field, the closest known name. Every default lives in these models, so ``orch schema``
shows the whole truth.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator

from orchestrator.errors import SpecError
from orchestrator.specerrors import data_path, named_field, plain_message, yaml_problem
from orchestrator.specparts import (ENV_KEY_RE, MAX_DEPTH, MAX_ENV_TOTAL, MAX_NODES, MAX_SETUP,  # noqa: F401
                                  MAX_SPEC_BYTES, NAME_RE, PATTERN_WORDS, EnvValue, Frozen, HostRef, InlineHost,
                                  Launch, OnFinish, Workspace, size_text)
from orchestrator.sweepkeys import MAX_COMBINATIONS, Scalar, check_key, duplicates
from remote_payload.config import TrainConfig

SweepKey = Annotated[str, AfterValidator(check_key)]
SweepValues = Annotated[list[Scalar], Field(min_length=1)]


class JobSpec(Frozen):
    """The whole job file. Exactly one of ``launch.command`` and ``train`` is set. With a
    ``sweep``, ``hosts`` is a pool and each combination is a job of its own (``sweep.py``)."""

    name: str = Field(pattern=NAME_RE, description="[a-z0-9-]; job ids are <name>-<yyyymmdd-hhmmss>-<4 hex>.")
    hosts: list[HostRef] = Field(min_length=1, description="Inventory names, `local`, or inline host objects.")
    workspace: Workspace = Field(default_factory=Workspace)
    setup: str | None = Field(None, description="Shell run on every node before launch; skipped when unchanged.")
    env: dict[str, EnvValue] = Field(default_factory=dict, description="Environment for setup and the job; "
                                     "one value at most 100 KiB, all of them together at most 1 MiB.")
    presets: list[Literal["autodl", "autodl-network-turbo", "hf-mirror", "pip-mirror"]] = Field(default_factory=list)
    launch: Launch = Field(default_factory=Launch)
    train: TrainConfig | None = Field(None, description="The built-in trainer; exclusive with launch.command.")
    outputs: list[str] = Field(
        default_factory=lambda: ["outputs/", "logs/", "metrics.jsonl"],
        description="gitignore-style patterns over the job folder: what `orch fetch` brings back.",
    )
    on_finish: OnFinish = Field(default_factory=OnFinish)
    sweep: dict[SweepKey, SweepValues] | None = Field(
        None, description="A sweep: dotted paths into this file (train.lr, train.lora.r, env.LR) and the values to "
        "try; `orch submit` makes one job per combination, each a one-node job on one host of `hosts` (a pool, "
        "round-robin). `orch submit --sweep KEY=V1,V2` adds a key or replaces its values (docs/sweeps.md).")

    @field_validator("env")
    @classmethod
    def _env_keys(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not ENV_KEY_RE.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
        total = sum(len(k.encode("utf-8")) + len(v.encode("utf-8")) + 2 for k, v in value.items())
        if total > MAX_ENV_TOTAL:
            raise ValueError(f"the variables are {size_text(total)} together; the server cannot pass much more than "
                             f"2 MiB of arguments and environment (orch allows {size_text(MAX_ENV_TOTAL)}) — put large "
                             "values in files in the workspace and pass their paths")
        return value

    @field_validator("setup")
    @classmethod
    def _setup_size(cls, value: str | None) -> str | None:
        size = len(value.encode("utf-8")) if value else 0
        if size > MAX_SETUP:
            raise ValueError(f"{size_text(size)} is more than orch allows ({size_text(MAX_SETUP)}) — put the script "
                             "in the workspace and run it from setup (bash setup.sh)")
        return value

    @field_validator("outputs")
    @classmethod
    def _outputs_relative(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if pattern.startswith("/") or ".." in Path(pattern.lstrip("!")).parts:
                raise ValueError(f"output pattern {pattern!r} must stay inside the job folder")
        return value

    @field_validator("sweep")
    @classmethod
    def _sweep_size(cls, value: dict[str, list[Scalar]] | None) -> dict[str, list[Scalar]] | None:
        count = 1
        for key, values in (value or {}).items():
            twice = duplicates(values)
            if twice:
                raise ValueError(f"{key} lists {', '.join(repr(v) for v in twice)} more than once")
            count *= len(values)
        if count > MAX_COMBINATIONS:
            raise ValueError(f"{count} combinations; one sweep makes at most {MAX_COMBINATIONS} jobs")
        return value

    @model_validator(mode="after")
    def _one_entrypoint(self) -> "JobSpec":
        if (self.launch.command is None) == (self.train is None):
            raise ValueError("set exactly one of `train` (the built-in trainer) and `launch.command`")
        names = [h if isinstance(h, str) else h.name for h in self.hosts]
        if len(set(names)) != len(names):
            raise ValueError("a host is listed twice")
        if len(names) > 1 and self.launch.nnodes not in (None, len(names)) and self.sweep is None:
            raise ValueError(f"launch.nnodes is {self.launch.nnodes} but {len(names)} hosts are listed: on SSH boxes "
                             "each host is one node (leave nnodes out)")
        return self


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


@lru_cache(maxsize=1)
def job_schema() -> dict[str, Any]:
    """``JobSpec``'s JSON Schema (computed once)."""
    return JobSpec.model_json_schema()


@lru_cache(maxsize=1)
def known_field_names() -> frozenset[str]:
    schema = job_schema()
    names: set[str] = set(schema.get("properties", {}))
    for definition in schema.get("$defs", {}).values():
        names.update(definition.get("properties", {}))
    return frozenset(names)


def format_errors(exc: ValidationError, data: Any, marks: Marks, where: str) -> str:
    """One line per wrong field: ``file:line:col: field.path: message (did you mean 'x'?)``.

    Messages say what is allowed in plain words (``specerrors.plain_message``), never the
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

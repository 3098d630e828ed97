"""job.yaml as pydantic models, and ``load_spec`` — the only function here that does I/O.

Errors name ``file:line:column``, the field path (``train.lora.r``) and, for an unknown
field, the closest known name. Every default lives in these models, so ``orch schema``
shows the whole truth.
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, ValidationInfo,
                      field_validator, model_validator)

from orchestrator.errors import SpecError
from orchestrator.slurmspec import SlurmJob
from orchestrator.specerrors import data_path, named_field, plain_message, yaml_problem
from remote_payload.config import TrainConfig

NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
PATTERN_WORDS = {NAME_RE: "lowercase letters, digits and '-', 1–40 characters, starting and ending with a letter or digit"}
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_SPEC_BYTES = 1_000_000
MAX_NODES = 50_000
MAX_DEPTH = 64
# Linux refuses one argv/env string over 128 KiB (MAX_ARG_STRLEN) and all of them over ~2 MiB
# together, and it says so only on the server, as "Argument list too long": stay well below.
MAX_ENV_VALUE = 100 << 10
MAX_ENV_TOTAL = 1 << 20
MAX_ARG = 100 << 10
MAX_COMMAND = 256 << 10
MAX_SETUP = 1 << 20  # setup runs from a file on the server; this is only a sanity bound


def size_text(n: int) -> str:
    """``300 KiB``, ``1.5 MiB``: a byte count for a message."""
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{max(1, round(n / 1024))} KiB"


def _env_value(value: str) -> str:
    if "\x00" in value:
        raise ValueError("contains a NUL byte")
    size = len(value.encode("utf-8"))
    if size > MAX_ENV_VALUE:
        raise ValueError(f"{size_text(size)} is too large for an environment variable: the server cannot pass one "
                         f"over 128 KiB (orch allows {size_text(MAX_ENV_VALUE)}) — put it in a file in the workspace "
                         "and pass its path")
    return value


EnvValue = Annotated[str, AfterValidator(_env_value)]


class Frozen(BaseModel):
    """Base of orch's records: immutable, and an unknown field is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class InlineHost(Frozen):
    """A host written into the job file instead of the inventory."""

    name: str = Field(pattern=NAME_RE, description="Name used in job ids, logs and `orch code`.")
    address: str = Field(min_length=1, description="Hostname or IP address.")
    port: int = Field(22, ge=1, le=65535)
    user: str = Field("root", min_length=1)
    identity_file: str | None = Field(None, description="Private key file on the laptop.")
    password_env: str | None = Field(None, description="Name of the environment variable holding the password.")
    root: str | None = Field(None, description="Where everything of orch lives on that host (default ~/orch).")
    python: str = Field("python3", description="The interpreter on that host, found through a login shell.")


def _host_kind(value: Any) -> str:
    return "inline" if isinstance(value, (dict, InlineHost)) else "name"


HostRef = Annotated[
    Union[Annotated[str, Tag("name")], Annotated[InlineHost, Tag("inline")]],
    Discriminator(_host_kind),
]


class Workspace(Frozen):
    path: str = Field(".", description="Local folder to sync, relative to the job file.")
    exclude: list[str] = Field(default_factory=list, description="gitignore-style patterns, on top of .gitignore and .orchignore.")


class Launch(Frozen):
    nproc_per_node: Literal["auto"] | Annotated[int, Field(ge=1, le=1024)] = Field(
        "auto", description="Processes per node: `auto` = GPUs on the node (1 without GPUs), or an int."
    )
    command: list[str] | None = Field(
        None,
        description="argv each process runs instead of the built-in trainer (under torchrun, or directly: see "
        "`launcher`); a string is split like a shell would. A leading `python` means the host's python.",
    )

    nnodes: int | None = Field(
        None, ge=1, le=10_000, description="Nodes: on SSH boxes, one per listed host (the default); on a Slurm "
        "host, how many nodes to allocate (default 1)."
    )
    slurm: SlurmJob | None = Field(None, description="What to ask a Slurm cluster for (docs/slurm.md).")
    rdzv_host: str | None = Field(
        None, description="Multi-node: the address the other nodes use to reach the first host "
        "(e.g. a private network address). Default: the first host's address."
    )
    rdzv_port: int | None = Field(None, ge=1, le=65535, description="Multi-node: rendezvous port (default: a free one).")
    launcher: Literal["auto", "torchrun", "direct"] = Field(
        "auto", description="How each node starts the job. `direct`: the supervisor runs the command itself with "
        "torchrun's environment (RANK=0, WORLD_SIZE=1, MASTER_ADDR/PORT, ...), skipping torchrun's agent and its "
        "seconds of start-up; one node and one process only. `torchrun`: always under torchrun. `auto`: direct "
        "exactly when the job is one node × one process, torchrun otherwise."
    )

    @field_validator("command", mode="before")
    @classmethod
    def _split_string(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"cannot split command: {exc}") from None
        return value

    @field_validator("command")
    @classmethod
    def _non_empty(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (not value or not value[0]):
            raise ValueError("command must name a program")
        sizes = [len(arg.encode("utf-8")) for arg in value or []]
        big = next((i for i, n in enumerate(sizes) if n > MAX_ARG), None)
        if big is not None:
            raise ValueError(f"argument {big + 1} is {size_text(sizes[big])}; the server cannot pass one over 128 KiB "
                             f"(orch allows {size_text(MAX_ARG)}) — put it in a file in the workspace and pass its path")
        if sum(sizes) > MAX_COMMAND:
            raise ValueError(f"the command is {size_text(sum(sizes))} in all; orch allows {size_text(MAX_COMMAND)} "
                             "— put long arguments in a file in the workspace")
        return value

    @field_validator("launcher")
    @classmethod
    def _direct_is_one_process(cls, value: str, info: ValidationInfo) -> str:
        nproc = info.data.get("nproc_per_node")
        if value == "direct" and isinstance(nproc, int) and nproc > 1:
            raise ValueError(f"`direct` starts one process, but nproc_per_node is {nproc} — use `torchrun` "
                             "(or `auto`, which picks torchrun for more than one process)")
        return value


class OnFinish(Frozen):
    shutdown: bool = Field(False, description="Power the host off when the job ends — after `orch fetch` has "
                           "confirmed the outputs, and never while another orch job runs there.")
    shutdown_after_fetch_timeout_s: int = Field(1800, ge=0, description="Shut down anyway after this long without a fetch.")
    shutdown_command: list[str] | None = Field(
        None, min_length=1, description="argv that powers the host off; default: the preset's (`shutdown` on "
        "AutoDL), else `shutdown -h now`."
    )


class JobSpec(Frozen):
    """The whole job file. Exactly one of ``launch.command`` and ``train`` is set."""

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

    @model_validator(mode="after")
    def _one_entrypoint(self) -> "JobSpec":
        if (self.launch.command is None) == (self.train is None):
            raise ValueError("set exactly one of `train` (the built-in trainer) and `launch.command`")
        names = [h if isinstance(h, str) else h.name for h in self.hosts]
        if len(set(names)) != len(names):
            raise ValueError("a host is listed twice")
        if len(names) > 1 and self.launch.nnodes not in (None, len(names)):
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

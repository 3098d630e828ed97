"""job.yaml as pydantic models (frozen, ``extra="forbid"``): names and bounds, inline hosts,
the workspace, ``launch:``, ``on_finish:``, and ``JobSpec``, the whole file.

Every default lives in these models, so ``orch schema`` (``job_schema``) shows the whole truth.
No I/O here: ``load.py`` reads a file and turns validation errors into file:line:col lines.
"""

from __future__ import annotations

import re
import shlex
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from orchestrator.providers.registry import PRESETS
from orchestrator.spec import commandform
from orchestrator.spec.slurm import SlurmJob
from orchestrator.spec.sweepkeys import MAX_COMBINATIONS, Scalar, check_key, duplicates
from remote_payload.contract import envvars
from remote_payload.contract.jobfolder import PROGRESS_GROUPS
from remote_payload.contract.train_config import TrainConfig

NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
PATTERN_WORDS = {NAME_RE: "lowercase letters, digits and '-', 1–40 characters, starting and ending with a letter or digit"}
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
PresetName = Literal[tuple(sorted(PRESETS))]  # type: ignore[valid-type]  # providers/registry.py
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
    wrong = envvars.problem(value)
    if wrong:
        raise ValueError(wrong)
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
        "`launcher`); a string is split like a shell would. A leading `python` means the host's python. A leading "
        "`cd DIR &&` runs it in DIR (relative to the workspace), `NAME=value` / `env NAME=value` set NAME for the "
        "job; no other shell syntax is read (docs/own-script.md).",
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
    launcher: Literal["auto", "torchrun", "direct", "accelerate", "deepspeed"] = Field(
        "auto", description="How each node starts the job. `direct`: the supervisor runs the command itself with "
        "torchrun's environment (RANK=0, WORLD_SIZE=1, MASTER_ADDR/PORT, ...), skipping torchrun's agent and its "
        "seconds of start-up; one node and one process only. `torchrun`, `accelerate`, `deepspeed`: that launcher "
        "starts the processes, once per node, with the job's processes per node, node count, node rank and "
        "rendezvous (a command that already starts with it keeps its other flags). `auto`: the launcher the "
        "command starts with (`torchrun`, `python -m torch.distributed.run`, `accelerate launch`, `deepspeed`); "
        "else direct exactly when the job is one node × one process, torchrun otherwise. Started so, a command of "
        "your own gets none of torchrun's variables, as under plain `python` (a framework that starts its own "
        "processes, like Lightning's `Trainer(devices=2)`, then starts them) (docs/own-script.md)."
    )
    resume_args: list[str] = Field(
        default_factory=list, description="Arguments appended to the command on every attempt after the first "
        "(`orch resume`), e.g. `[--init_from=resume]`; `{last_checkpoint}` in one is the newest checkpoint-N "
        "folder orch sees in the job folder (without one, resume_args are left out and the log says so). A string "
        "is split like a shell would. Every attempt also gets ORCH_ATTEMPT (1, 2, ...)."
    )
    progress: str | None = Field(
        None, description="A Python regular expression for the script's own progress lines, with named groups "
        "among step, loss, total_steps, epoch, lr, eval_loss, tokens_per_s (at least step or loss), e.g. "
        "`it (?P<step>\\d+) loss (?P<loss>[\\d.]+)`. Common formats are read without it (docs/own-script.md)."
    )
    gpus: Literal["auto"] | Annotated[int, Field(ge=0, le=1024)] = Field(
        "auto", description="GPUs each node waits for in its host's queue and gets as CUDA_VISIBLE_DEVICES "
        "(docs/queue.md): `auto` = nproc_per_node when it is a number, every GPU of the node for `auto`; 0 = a CPU "
        "job, which never waits. With nproc_per_node `auto`, a number here is also the processes per node."
    )
    memory_gb: float | None = Field(
        None, gt=0, le=4096, description="GPU memory each of those GPUs must have free (where nvidia-smi says it); "
        "a host whose GPUs are all smaller fails the job at once."
    )
    priority: int = Field(
        0, ge=-1_000_000, le=1_000_000, description="Place in the host's queue: higher first; equal priorities "
        "start in the order they were queued (FIFO)."
    )

    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=list, max_length=16, description="Ports the job serves on its (first) node, e.g. `[6006]` "
        "for TensorBoard: `orch submit --follow` and `orch logs -f` print the `orch tunnel` command that makes them "
        "reachable on the laptop, and `orch tunnel JOB` opens them all (docs/commands.md: orch tunnel)."
    )

    @field_validator("ports")
    @classmethod
    def _ports_once(cls, value: list[int]) -> list[int]:
        twice = sorted({p for p in value if value.count(p) > 1})
        if twice:
            raise ValueError(f"port {', '.join(map(str, twice))} is listed more than once")
        return value

    @model_validator(mode="after")
    def _a_process_per_gpu(self) -> "Launch":
        if isinstance(self.nproc_per_node, int) and isinstance(self.gpus, int) and 0 < self.gpus < self.nproc_per_node:
            raise ValueError(f"nproc_per_node is {self.nproc_per_node} but gpus is {self.gpus}: each process needs "
                             "a GPU of its own (gpus: 0 runs on the CPU)")
        return self

    @field_validator("command", "resume_args", mode="before")
    @classmethod
    def _split_string(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            try:
                return shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"cannot split {info.field_name}: {exc}") from None
        return value

    @field_validator("progress")
    @classmethod
    def _progress_regex(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            pattern = re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        unknown = sorted(set(pattern.groupindex) - set(PROGRESS_GROUPS))
        if unknown:
            raise ValueError(f"unknown group(s) {', '.join(unknown)}: use {', '.join(PROGRESS_GROUPS)}")
        if not {"step", "loss"} & set(pattern.groupindex):
            raise ValueError("needs a named group `step` or `loss`, e.g. (?P<step>\\d+)")
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

    @field_validator("command")
    @classmethod
    def _shell_forms(cls, value: list[str] | None) -> list[str] | None:
        if value:
            commandform.read(value)  # a leading cd/NAME=value orch applies; refuses shell syntax elsewhere
        return value

    @field_validator("launcher")
    @classmethod
    def _direct_is_one_process(cls, value: str, info: ValidationInfo) -> str:
        nproc = info.data.get("nproc_per_node")
        if value == "direct" and isinstance(nproc, int) and nproc > 1:
            raise ValueError(f"`direct` starts one process, but nproc_per_node is {nproc} — use `torchrun` "
                             "(or `auto`, which picks torchrun for more than one process)")
        return value


class Notify(Frozen):
    """A webhook the server calls when the job ends (remote_payload/supervisor/webhook.py)."""

    url: str | None = Field(None, description="http(s) URL of a chat webhook (Slack, Feishu/Lark, DingTalk) or any "
                            "endpoint taking JSON. It is recorded with the job file: for a URL holding a token use "
                            "url_env.")
    url_env: str | None = Field(None, pattern=ENV_KEY_RE.pattern, description="Name of an environment variable on the "
                                "server (set in its login shell, e.g. ~/.bashrc) holding the URL; it never leaves "
                                "the server.")
    format: Literal["auto", "slack", "feishu", "dingtalk", "json"] = Field(
        "auto", description="The JSON body: Slack's, Feishu's or DingTalk's text message; `json` adds the job's "
        "fields (job_id, state, reason, exit_code, host, metrics); `auto` picks by the URL's host (json otherwise).")
    timeout_s: float = Field(10.0, gt=0, le=120, description="Seconds the call may take.")
    on: list[Literal["succeeded", "failed", "cancelled"]] = Field(
        default_factory=lambda: ["succeeded", "failed", "cancelled"], min_length=1,
        description="The end states that notify.")

    @field_validator("url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> "Notify":
        if (self.url is None) == (self.url_env is None):
            raise ValueError("give exactly one of url and url_env")
        return self


class OnFinish(Frozen):
    notify: Notify | None = Field(None, description="Call a webhook when the job ends (docs/notifications.md).")
    shutdown: bool = Field(False, description="Power the host off when the job ends — after `orch fetch` has "
                           "confirmed the outputs, and never while another orch job runs there.")
    power_off: bool = Field(False, description="Power the box off when the job ends, like `shutdown` from inside the "
                            "box; on a provider host also through its API from a laptop that watches the job "
                            "(`submit --follow --watch`), after the last fetch (docs/providers.md).")
    shutdown_after_fetch_timeout_s: int = Field(1800, ge=0, description="Shut down anyway after this long without a fetch.")
    shutdown_command: list[str] | None = Field(
        None, min_length=1, description="argv that powers the host off; default: the preset's (`shutdown` on "
        "AutoDL), else `shutdown -h now`."
    )


class RecoveryRent(Frozen):
    provider: str = Field(description="Where to rent a replacement: a provider that rents (orch rent --provider).")
    gpu: str = Field(min_length=1, description="The GPU model to ask for, as orch rent --gpu names it (RTX_4090).")
    max_price: float | None = Field(None, gt=0, description="The most a replacement may cost per hour, in the "
                                    "provider's currency.")
    interruptible: bool = Field(False, description="Ask for an interruptible (spot) instance where the provider "
                                "offers them.")
    token_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="The variable holding the "
                                  "provider's token (default: the provider's usual one); its value goes to the "
                                  "controller's memory.")
    api_url: str | None = Field(None, pattern=r"^https?://[^\s]+$", description="The provider's API (default: its "
                                "own); a proxy or a stand-in, as orch rent --api-url.")
    user: str = Field("root", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", description="The login user of the rented "
                      "box, as orch rent --user.")
    root: str | None = Field(None, min_length=1, description="orch's folder on the rented box (default: the "
                             "provider's), as orch rent --root.")
    python: str = Field("python3", min_length=1, description="The rented box's Python, as orch rent --python.")

    @field_validator("provider")
    @classmethod
    def _rentable(cls, value: str) -> str:
        from orchestrator.providers.registry import RENTABLE

        if value not in RENTABLE:
            raise ValueError(f"{value!r} cannot be rented by orch (one of: {', '.join(RENTABLE)})")
        return value


class Recovery(Frozen):
    """A managed job (docs/managed.md): the controller moves it when its box is lost."""

    hosts: list[str] = Field(default_factory=list, description="Inventory hosts where the job may continue, in "
                             "order: the first that answers takes it.")
    rent: RecoveryRent | None = Field(None, description="Rent a replacement when no host of `hosts` answers.")
    max_restarts: int = Field(3, ge=0, le=100, description="Recoveries at most; after that a lost job stays lost.")

    @field_validator("hosts")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not NAME_RE_HOST.match(name):
                raise ValueError(f"{name!r} is not a host name of the inventory")
        if len(set(value)) != len(value):
            raise ValueError("a host is named twice")
        return value


NAME_RE_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


SweepKey = Annotated[str, AfterValidator(check_key)]
SweepValues = Annotated[list[Scalar], Field(min_length=1)]


class JobSpec(Frozen):
    """The whole job file. Exactly one of ``launch.command`` and ``train`` is set. With a
    ``sweep``, ``hosts`` is a pool and each combination is a job of its own (``orchestrator/sweep/expand.py``)."""

    name: str = Field(pattern=NAME_RE, description="[a-z0-9-]; job ids are <name>-<yyyymmdd-hhmmss>-<4 hex>.")
    hosts: list[HostRef] = Field(min_length=1, description="Inventory names, `local`, or inline host objects.")
    workspace: Workspace = Field(default_factory=Workspace)
    setup: str | None = Field(None, description="Shell run on every node before launch; skipped when unchanged.")
    env: dict[str, EnvValue] = Field(default_factory=dict, description="Environment for setup and the job; "
                                     "one value at most 100 KiB, all of them together at most 1 MiB.")
    secret_env: list[str] = Field(
        default_factory=list, description="Names of variables read from the laptop's environment at submit (and at "
        "orch resume) and set in the job's environment on every node: delivered over the connection, never written "
        "in a file on the server, a record, a log or the registry (HF_TOKEN, a webhook URL for url_env).")
    presets: list[PresetName] = Field(default_factory=list)
    launch: Launch = Field(default_factory=Launch)
    train: TrainConfig | None = Field(None, description="The built-in trainer; exclusive with launch.command.")
    outputs: list[str] = Field(
        default_factory=lambda: ["outputs/", "logs/", "metrics.jsonl"],
        description="gitignore-style patterns over the job folder: what `orch fetch` brings back.",
    )
    on_finish: OnFinish = Field(default_factory=OnFinish)
    recovery: Recovery | None = Field(None, description="Make it a managed job: the controller (orch controller up) "
                                      "watches it and moves it when its box is lost (docs/managed.md).")
    max_cost: float | None = Field(
        None, gt=0, le=1e9, description="Stop the job when its cost reaches this, in the currency of its hosts' "
        "price (the provider's: CNY on AutoDL, USD on vast and RunPod; a plain host's --price-per-hour). The cost is "
        "the price per hour of every node together times the time the job's supervisors ran, all attempts counted. "
        "The server decides, with the laptop closed: it stops the job as `orch cancel` does (the trainer "
        "checkpoints), the reason says so, and on_finish.power_off / shutdown powers the box off without waiting "
        "for a fetch. Every host must have a known price (exit 2 otherwise); not on a Slurm cluster "
        "(docs/providers.md: Budgets).")
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
            if envvars.reserved(key):
                raise ValueError(f"{key}: {envvars.reserved(key)}")
        total = sum(len(k.encode("utf-8")) + len(v.encode("utf-8")) + 2 for k, v in value.items())
        if total > MAX_ENV_TOTAL:
            raise ValueError(f"the variables are {size_text(total)} together; the server cannot pass much more than "
                             f"2 MiB of arguments and environment (orch allows {size_text(MAX_ENV_TOTAL)}) — put large "
                             "values in files in the workspace and pass their paths")
        return value

    @field_validator("secret_env")
    @classmethod
    def _secret_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not ENV_KEY_RE.match(name):
                raise ValueError(f"{name!r} is not an environment variable name: list names only (the values are "
                                 "read from the laptop's environment)")
            if envvars.reserved(name):
                raise ValueError(f"{name}: {envvars.reserved(name)}")
        twice = sorted({n for n in value if value.count(n) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} listed more than once")
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
        prefixed = {name for name, _ in commandform.read(self.launch.command).env} if self.launch.command else set()
        for where, names in (("env", set(self.env)), ("a NAME=value of launch.command", prefixed)):
            both = sorted(set(self.secret_env) & names)
            if both:
                raise ValueError(f"{', '.join(both)} is in both {where} and secret_env: a secret's value comes from "
                                 f"the laptop's environment, leave it out of {where}")
        names = [h if isinstance(h, str) else h.name for h in self.hosts]
        if len(set(names)) != len(names):
            raise ValueError("a host is listed twice")
        if len(names) > 1 and self.launch.nnodes not in (None, len(names)) and self.sweep is None:
            raise ValueError(f"launch.nnodes is {self.launch.nnodes} but {len(names)} hosts are listed: on SSH boxes "
                             "each host is one node (leave nnodes out)")
        return self


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

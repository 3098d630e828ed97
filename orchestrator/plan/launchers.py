"""Pure: the launchers a ``launch.command`` may start with — torchrun (also ``python -m
torch.distributed.run``, and the deprecated ``python -m torch.distributed.launch``), ``accelerate
launch`` and ``deepspeed`` — and the argv that runs one of them once per node with the job's
topology (docs/own-script.md, "Launchers"). The command is read after its leading ``cd DIR &&``
and ``NAME=value`` (spec/commandform.py); a launcher hidden deeper is plan/hidden.py's.

A launcher inside the command is never nested under orch's own torchrun: orch runs that
launcher itself, through the host's python (``python -m <its module>``, so it is the same
environment as the job's ``python``), with the plan's processes per node, node count, node
rank and rendezvous. The rules of who wins:

- processes per node: ``launch.nproc_per_node`` when job.yaml sets a number; else the
  command's own (torchrun ``--nproc_per_node N``, accelerate ``--num_processes T`` over
  ``--num_machines M``, deepspeed ``--num_gpus N``); else ``auto`` (a process per GPU).
- nodes, node rank and rendezvous: always the job's (its hosts; a Slurm allocation's nodes).
  The command's own flags for them are dropped; ``orch check`` names each (``notes``).
- every other flag of the command is kept, in its place and spelling.

Only argument lists are handled here; the server fills in what only it knows (a free port,
``FREE_PORT``; deepspeed's GPU list: remote_payload/supervisor/launchers.py).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import UsageError
from orchestrator.spec import commandform
from orchestrator.spec.model import JobSpec
from remote_payload.contract.jobfolder import DEEPSPEED_HOSTFILE, FREE_PORT

LAUNCHERS = ("torchrun", "accelerate", "deepspeed")
MODULES = {"torchrun": "torch.distributed.run", "accelerate": "accelerate.commands.launch",
           "deepspeed": "deepspeed.launcher.runner"}
# torch.distributed.launch is torch.distributed.run's parser plus --use-env (off by default: each
# worker gets --local-rank=N as an argument); orch runs that module itself, so both behave as written.
TORCH_LAUNCH = "torch.distributed.launch"

# Each launcher's flags that take no value (canonical: no dashes, '-' as '_'); every other
# flag it knows takes one. Read off torch 2.13's, accelerate 1.15's and deepspeed 0.19's parsers.
_FLAGS = {
    "torchrun": {"h", "help", "standalone", "m", "module", "no_python", "run_path", "virtual_local_rank", "use_env"},
    "accelerate": {"h", "help", "q", "quiet", "cpu", "multi_gpu", "tpu", "enable_cpu_affinity", "dynamo_use_fullgraph",
                   "dynamo_use_dynamic", "dynamo_use_regional_compilation", "use_deepspeed", "use_fsdp",
                   "use_parallelism_config", "use_megatron_lm", "same_network", "m", "module", "no_python",
                   "tpu_cluster", "no_tpu_cluster", "tpu_use_sudo", "downcast_bf16", "fp8_use_autocast_during_eval",
                   "debug"},
    "deepspeed": {"h", "help", "module", "no_python", "no_local_rank", "no_ssh", "no_ssh_check", "force_multi",
                  "save_pid", "bind_cores_to_rank", "q", "quiet"},
}
_ALIASES = {"torchrun": {"nproc_per_node": "nproc_per_node", "r": "redirects", "t": "tee"},
            "accelerate": {"t": "tee"},
            "deepspeed": {"num_accelerators": "num_gpus", "H": "hostfile", "i": "include", "e": "exclude"}}
# The flags orch sets itself: the command's own are dropped (and named by ``notes``).
OWNED = {
    "torchrun": {"nnodes", "nproc_per_node", "standalone", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf",
                 "node_rank", "master_addr", "master_port"},
    "accelerate": {"num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port"},
    "deepspeed": {"num_nodes", "num_gpus", "node_rank", "master_addr", "master_port", "hostfile", "include",
                  "exclude", "no_ssh", "launcher", "launcher_args", "force_multi", "ssh_port"},
}
# accelerate starts several processes only in one of these modes; with none, orch adds --multi_gpu
# (accelerate's torchrun launcher; ``cpu_env`` keeps them on the CPU where that is what is asked for).
ACCELERATE_MODES = {"multi_gpu", "use_deepspeed", "use_fsdp", "use_megatron_lm", "tpu", "config_file"}
# accelerate's own switch to the CPU (what its --cpu sets for its one process): Accelerator() and
# Hugging Face's TrainingArguments (transformers 5) read it, and then put the ranks torchrun
# started in one gloo world (MULTI_CPU) instead of each training alone (accelerate 1.16's state.py).
CPU_ENV = "ACCELERATE_USE_CPU"


@dataclass(frozen=True)
class Option:
    """One flag of the launcher as the command wrote it (``tokens``: one or two argv items)."""

    name: str  # canonical
    value: str | None
    tokens: tuple[str, ...]


@dataclass(frozen=True)
class Command:
    """``launch.command`` seen as a launcher's: its options and the program it starts."""

    launcher: str
    options: tuple[Option, ...]
    program: tuple[str, ...]  # the script (or module, or --no_python command) and its arguments
    written: bool  # the command itself starts with the launcher (else job.yaml's launch.launcher named it)
    extra: tuple[str, ...] = field(default=())  # flags orch adds because of how the command was written
    module: str = ""  # the module orch runs (MODULES[launcher], or TORCH_LAUNCH as the command wrote it)

    def get(self, name: str) -> Option | None:
        return next((o for o in reversed(self.options) if o.name == name), None)


def is_python(word: str) -> bool:
    base = posixpath.basename(word)
    return base == "python" or (base.startswith("python") and base[6:].replace(".", "").isdigit())


def written_launcher(command: list[str]) -> tuple[str, int, str] | None:
    """(launcher, words it takes, module orch runs) when ``command`` starts with one, by any path:
    ``torchrun``, ``/opt/venv/bin/torchrun``, ``python[3.X] [-u ...] -m torch.distributed.run``
    (or ``-mtorch.distributed.run``), ``python -m torch.distributed.launch``, ``python
    /opt/venv/bin/torchrun``, ``accelerate launch``, ``python -m accelerate.commands.launch``,
    ``deepspeed``, ``python -m deepspeed.launcher.runner``; else None."""
    taken = 0
    if command and is_python(command[0]):
        at = _python_target(command)
        if at is None:
            return None
        module, taken = at
        if module is not None:
            if module == TORCH_LAUNCH:
                return "torchrun", taken, TORCH_LAUNCH
            name = next((n for n, m in MODULES.items() if m == module), None)
            return (name, taken, module) if name else None
        taken -= 1  # `python /path/to/torchrun ...`: the script is the launcher
    head = posixpath.basename(command[taken]) if taken < len(command) else ""
    if head == "torchrun":
        return "torchrun", taken + 1, MODULES["torchrun"]
    if head == "accelerate" and command[taken + 1:taken + 2] == ["launch"]:
        return "accelerate", taken + 2, MODULES["accelerate"]
    if head == "deepspeed":
        return "deepspeed", taken + 1, MODULES["deepspeed"]
    return None


def _python_target(command: list[str]) -> tuple[str | None, int] | None:
    """What ``python [options]`` runs (``commandform.python_target``): (module, words taken) for
    ``-m MODULE``, (None, words taken with the script) for a script; None for ``-c`` and the like."""
    target = commandform.python_target(command)
    if target is None:
        return None
    kind, name, at = target
    return (name if kind == "module" else None), at + 1


def _canonical(launcher: str, flag: str) -> str:
    name = flag.lstrip("-").replace("-", "_")
    return _ALIASES[launcher].get(name, name)


def _split(launcher: str, words: list[str]) -> tuple[list[Option], list[str]]:
    """The launcher's options up to its first positional (the program), as argparse reads
    them. A flag this table does not know takes a value unless the next word is a flag or
    ends in ``.py`` (launchers add flags across versions)."""
    options: list[Option] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            return options, words[i + 1:]
        if not word.startswith("-") or word == "-":
            return options, words[i:]
        flag, eq, value = word.partition("=")
        name = _canonical(launcher, flag)
        if eq:
            options.append(Option(name, value, (word,)))
            i += 1
            continue
        nxt = words[i + 1] if i + 1 < len(words) else None
        known_flag = name in _FLAGS[launcher]
        takes = not known_flag and nxt is not None and not nxt.startswith("-") and \
            (name in _known_values(launcher) or not nxt.endswith(".py"))
        if takes:
            options.append(Option(name, nxt, (word, str(nxt))))
            i += 2
        else:
            options.append(Option(name, None, (word,)))
            i += 1
    return options, []


def _known_values(launcher: str) -> set[str]:
    return OWNED[launcher] | {"max_restarts", "config_file", "mixed_precision", "log_dir", "gpu_ids"}


def parse(command: list[str], launcher: str) -> Command | None:
    """``command`` as ``launcher``'s (``launch.launcher``; ``auto`` finds it in the command).
    None for a plain command under ``auto``/``direct`` (the supervisor or orch's own torchrun
    runs it). ``UsageError`` when the command starts with a launcher that job.yaml's
    ``launch.launcher`` contradicts, or names no program."""
    found = written_launcher(command)
    if found is not None:
        name, taken, module = found
        if launcher not in ("auto", name):
            raise UsageError(f"launch.command starts with {' '.join(command[:taken])} but launch.launcher is "
                             f"`{launcher}`: leave launcher at `auto` (orch then runs {name} once per node)")
        options, program = _split(name, command[taken:])
        if not program:
            raise UsageError(f"launch.command: {' '.join(command[:taken])} is given no script to run")
        return Command(name, tuple(options), tuple(program), written=True, module=module)
    if launcher not in LAUNCHERS or launcher == "torchrun":
        return None  # orch's torchrun around a plain command stays plan/build.py's torchrun_argv
    program = list(command)
    extra: tuple[str, ...] = ()
    if is_python(program[0]):
        program = program[1:]
        if program[:1] == ["-m"]:
            extra, program = ("--module",), program[1:]
    else:
        extra = ("--no_python",)
    if not program:
        raise UsageError("launch.command names no script for the launcher to run")
    return Command(launcher, (), tuple(program), written=False, extra=extra, module=MODULES[launcher])


def _int(option: Option | None) -> int | None:
    if option is None or option.value is None:
        return None
    try:
        return int(option.value)
    except ValueError:
        return None  # torchrun's `gpu`, `auto`, `cpu`: the job's `auto`


def asked_per_node(cmd: Command) -> int | None:
    """The processes per node the command asks for itself, or None."""
    if cmd.launcher == "torchrun":
        return _int(cmd.get("nproc_per_node"))
    if cmd.launcher == "accelerate":
        total, machines = _int(cmd.get("num_processes")), _int(cmd.get("num_machines")) or 1
        return max(total // machines, 1) if total else None
    return _int(cmd.get("num_gpus"))


def asked_nodes(cmd: Command) -> int | None:
    key = {"torchrun": "nnodes", "accelerate": "num_machines", "deepspeed": "num_nodes"}[cmd.launcher]
    option = cmd.get(key)
    if option is None or option.value is None:
        return None
    try:
        return int(option.value.split(":")[-1])  # torchrun's MIN:MAX
    except ValueError:
        return None


@dataclass(frozen=True)
class Topology:
    """What one node's launcher is told: ``endpoint`` is ``host:port`` of the rendezvous
    (None on one node: the launcher gets a port free on the node, ``FREE_PORT``)."""

    python: str
    nproc: int
    nnodes: int
    node_rank: int
    endpoint: str | None
    run_id: str
    job_dir: str


def argv(cmd: Command, top: Topology) -> list[str]:
    """The exact argv one node runs: the launcher through the host's python, orch's topology
    flags, then the command's own flags (less the ones orch sets) and its program."""
    head = [top.python, "-m", cmd.module or MODULES[cmd.launcher]]
    if cmd.launcher == "torchrun":
        return [*head, *_torchrun(cmd, top), *_kept(cmd), *cmd.extra, *cmd.program]
    if cmd.launcher == "accelerate":
        flags, replaced = _accelerate(cmd, top)
        return [*head, *flags, *_kept(cmd, replaced), *cmd.extra, *cmd.program]
    return [*head, *_deepspeed(top), *_kept(cmd), *cmd.extra, *cmd.program]


def _kept(cmd: Command, also: frozenset[str] = frozenset()) -> list[str]:
    """The command's own flags, as written, less the ones orch sets (and ``also``)."""
    drop = OWNED[cmd.launcher] | also
    return [t for o in cmd.options if o.name not in drop for t in o.tokens]


def _torchrun(cmd: Command, top: Topology) -> list[str]:
    restarts = [] if cmd.get("max_restarts") else ["--max_restarts", "0"]
    if top.nnodes == 1:
        return ["--standalone", "--nnodes", "1", "--nproc_per_node", str(top.nproc), *restarts]
    assert top.endpoint
    return ["--nnodes", str(top.nnodes), "--nproc_per_node", str(top.nproc), "--rdzv_backend", "c10d",
            "--rdzv_endpoint", top.endpoint, "--rdzv_id", top.run_id, "--rdzv_conf", "join_timeout=300", *restarts]


def _accelerate(cmd: Command, top: Topology) -> tuple[list[str], frozenset[str]]:
    """orch's flags, and the command's mode flags they replace."""
    total = top.nproc * top.nnodes
    flags = ["--num_processes", str(total), "--num_machines", str(top.nnodes)]
    if top.nnodes > 1:
        assert top.endpoint
        addr, _, port = top.endpoint.rpartition(":")
        flags += ["--machine_rank", str(top.node_rank), "--main_process_ip", addr, "--main_process_port", port]
    else:
        flags += ["--main_process_port", FREE_PORT]
    names = {o.name for o in cmd.options}
    if total > 1 and "cpu" in names:
        return [*flags, "--multi_gpu"], frozenset({"cpu"})
    if total > 1 and not names & ACCELERATE_MODES:
        return [*flags, "--multi_gpu"], frozenset()
    if total == 1 and "multi_gpu" in names:
        return flags, frozenset({"multi_gpu"})
    return flags, frozenset()


def cpu_env(cmd: Command | None, processes: int, gpus: int, own: dict[str, str],
            hidden: bool = False) -> dict[str, str]:
    """``{CPU_ENV: "true"}`` for a node whose several processes must run on the CPU: the
    command's ``accelerate launch --cpu`` with more than one process (orch runs ``--multi_gpu``
    in its place: ``--cpu`` alone starts one), or a node without GPUs (``gpus`` 0: none that
    nvidia-smi lists, or none the job's ``CUDA_VISIBLE_DEVICES`` leaves) running more than one
    process (``processes``, all nodes together) or a launcher hidden in a script (``hidden``: its
    count is its own). Without it, accelerate and Hugging Face's Trainer on such a node leave
    each rank alone (world size 1). Empty when the job's env (``own``) sets the variable itself,
    and for one process."""
    if CPU_ENV in own:
        return {}
    asked = cmd is not None and cmd.launcher == "accelerate" and cmd.get("cpu") is not None
    if (asked and processes > 1) or (gpus == 0 and (processes > 1 or hidden)):
        return {CPU_ENV: "true"}
    return {}


def _deepspeed(top: Topology) -> list[str]:
    flags = ["--num_gpus", str(top.nproc)]
    if top.nnodes == 1:
        return [*flags, "--master_port", FREE_PORT]
    assert top.endpoint
    addr, _, port = top.endpoint.rpartition(":")
    return [*flags, "--num_nodes", str(top.nnodes), "--node_rank", str(top.node_rank), "--master_addr", addr,
            "--master_port", port, "--no_ssh", "--hostfile", posixpath.join(top.job_dir, DEEPSPEED_HOSTFILE)]


def notes(cmd: Command, nproc_in_spec: int | str, nnodes: int) -> list[str]:
    """What ``orch check`` says about the command's own flags: which of them orch replaces or
    drops, and which count wins. Empty when nothing the command says is overridden."""
    out: list[str] = []
    asked = asked_per_node(cmd)
    per_node_flag = {"torchrun": "--nproc_per_node", "accelerate": "--num_processes", "deepspeed": "--num_gpus"}
    if asked is not None and isinstance(nproc_in_spec, int) and asked != nproc_in_spec:
        out.append(f"the command asks for {asked} process(es) per node ({per_node_flag[cmd.launcher]}) but "
                   f"launch.nproc_per_node is {nproc_in_spec}: job.yaml wins, {nproc_in_spec} per node")
    elif asked is not None:
        out.append(f"{asked} process(es) per node, from the command's {per_node_flag[cmd.launcher]} "
                   "(launch.nproc_per_node is auto)")
    nodes = asked_nodes(cmd)
    if nodes is not None and nodes != nnodes:
        out.append(f"the command asks for {nodes} node(s) but the job has {nnodes} (one per host): the job's "
                   "hosts win")
    dropped = sorted({o.tokens[0].partition("=")[0] for o in cmd.options if o.name in OWNED[cmd.launcher]
                      and o.name not in ("nproc_per_node", "num_processes", "num_gpus", "nnodes", "num_machines",
                                         "num_nodes")})
    if dropped:
        out.append(f"orch sets the rendezvous itself: the command's {', '.join(dropped)} "
                   f"{'is' if len(dropped) == 1 else 'are'} replaced")
    names = {o.name for o in cmd.options}
    if cmd.module == TORCH_LAUNCH and "use_env" not in names:
        out.append(f"{TORCH_LAUNCH} (deprecated) passes each process --local-rank=N as an argument (its script must "
                   "accept it; --use-env passes it in LOCAL_RANK only): orch runs that module as written")
    if cmd.launcher == "accelerate" and "cpu" in names:
        out.append("accelerate's --cpu starts one process whatever --num_processes says; for more than one, orch "
                   f"runs --multi_gpu in its place with {CPU_ENV}=true, so they are one world on the CPU (gloo)")
    return out


def launcher_notes(spec: JobSpec, counted: JobSpec, nnodes: int) -> list[str]:
    """What ``orch check`` says of the launcher ``launch.command`` starts with: that orch runs it
    once per node, which of its flags and counts orch replaces (``notes``), and the processes
    per node its accelerate config file gives. ``counted``: ``spec`` itself, or ``spec`` with
    that file's count (``with_config``; ``jobs/launchconfig.py`` reads the file). Empty for the
    built-in trainer or a plain command; ``UsageError`` (exit 2) when ``launch.launcher``
    contradicts the command."""
    cmd = for_spec(spec)
    if cmd is None:
        return []
    lines = [f"{cmd.launcher}: orch runs it once per node with the job's topology (--dry-run shows the argv)"]
    lines += [f"{cmd.launcher}: {note}" for note in notes(cmd, spec.launch.nproc_per_node, nnodes)]
    if counted is not spec:
        lines.append(f"{cmd.launcher}: {counted.launch.nproc_per_node} process(es) per node, from num_processes in "
                     f"{config_file(spec)} (launch.nproc_per_node is auto)")
    return lines


def for_spec(spec: JobSpec) -> Command | None:
    """``launch.command`` as the launcher's that orch runs once per node, or None (the built-in
    trainer; a plain command, run directly or under orch's torchrun)."""
    if spec.launch.command is None:
        if spec.launch.launcher in ("accelerate", "deepspeed"):
            raise UsageError(f"launch.launcher `{spec.launch.launcher}` needs launch.command: the built-in trainer "
                             "runs under torchrun (or directly for one process)")
        return None
    return parse(list(commandform.read(list(spec.launch.command)).argv), spec.launch.launcher)


def wanted_nproc(spec: JobSpec) -> int | str:
    """Processes per node as asked: job.yaml's ``launch.nproc_per_node`` when a number, else the
    command's own launcher flag (``--nproc_per_node``, ...), else ``auto``."""
    if isinstance(spec.launch.nproc_per_node, int):
        return spec.launch.nproc_per_node
    cmd = for_spec(spec)
    asked = asked_per_node(cmd) if cmd is not None else None
    return asked if asked is not None else "auto"


def config_file(spec: JobSpec) -> str | None:
    """The ``--config_file`` an ``accelerate launch`` command names (relative to the workspace,
    the job's working directory), or None."""
    cmd = for_spec(spec)
    option = cmd.get("config_file") if cmd is not None and cmd.launcher == "accelerate" else None
    return option.value if option is not None else None


def with_config(spec: JobSpec, config: dict[str, Any] | None) -> JobSpec:
    """``spec`` with the processes per node of the accelerate config file its command names
    (``num_processes`` over ``num_machines``: accelerate counts processes across machines) when
    neither job.yaml nor the command's own flags give a number — the file's count then wins over
    ``auto``, as its flags' would. Anything else in the file is accelerate's to read."""
    if config is None or wanted_nproc(spec) != "auto":
        return spec
    total, machines = config.get("num_processes"), config.get("num_machines") or 1
    if not isinstance(total, int) or isinstance(total, bool) or total < 1 or not isinstance(machines, int) \
            or machines < 1:
        return spec
    launch = spec.launch.model_copy(update={"nproc_per_node": max(total // machines, 1)})
    return spec.model_copy(update={"launch": launch})

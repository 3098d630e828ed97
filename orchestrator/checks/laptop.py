"""What the laptop can know is wrong with a job before connecting anywhere.

``laptop_checks`` runs in ``orch check`` and, before it connects, in ``orch submit``. It raises
``SpecError`` (exit 2) naming ``file:line:col`` of the field when

- ``workspace.path`` does not exist or is not a folder (the message shows the resolved path);
- an item of ``workspace.exclude`` or ``outputs`` is not a gitignore pattern (``globs/read.py``);
- ``train.precision`` is one that remote_payload/contract/precision.py refuses with ``train.strategy``
  (fsdp with fp16): the same rules the trainer applies on the server, found before the sync;
- ``train.deepspeed`` names a DeepSpeed JSON file of the workspace that is missing, is not JSON
  (its ``file:line:col``), or says what the trainer refuses (remote_payload/contract/zeroconfig.py:
  unknown keys, optimizer/scheduler sections, batch/accumulation/clipping/precision against
  ``train:``, ZeRO stage and offload): ``file:line: key: why``, then where job.yaml names the file;
- ``launch.command`` runs a file of the workspace that will not be synced: the script of
  ``python [opts] X``, ``bash|sh [opts] X.sh``, ``torchrun``/``accelerate launch [opts] X.py``,
  a relative program such as ``./run.sh``, or a module of the workspace (``python -m pkg.mod``
  needs ``pkg/mod.py`` or ``pkg/mod/__main__.py``). A file that is there but excluded names the
  rule that excluded it (``.gitignore:3 'data/'``, ``workspace.exclude[0] '*.sh'``) and the
  ``.orchignore`` line that brings it back (``sync/excluded.py``, ``why``).

The built-in trainer's data files and ``data.transform`` module are checked by ``checks/traindata.py``
(excluded or, for ``data.mix`` and the transform, missing: exit 2; a missing ``data.train`` warns).

``launch.progress`` that would blow the server's CPU budget on a short hostile line is refused
too, and a repeat inside a repeat warned about (``checks/progress.py``).

``laptop_report`` does the same and returns warnings, which never stop anything:

- an argument of ``launch.command`` that reads as a relative path of the workspace (it holds a
  ``/`` or ends in a data or code extension, as itself or as the value after ``=``:
  ``--data=data/synth/train.bin``) names a file the rules leave out, or a folder holding such
  files: the rule and the ``.orchignore`` line that brings them; one that is neither in the
  workspace nor left out by a rule is named too (the job will not find it unless it makes it)
  — but not the value of an output option (``--out_dir``), whose files the job writes, nor a
  name without a known extension whose first folder the workspace lacks (``gpt2/medium``,
  ``meta-llama/Llama-2-7b``: a model id, not a path);
- an output option's relative folder (``--out_dir=out``) that ``outputs:`` does not select, or,
  without one, a ``launch.command`` job whose file leaves ``outputs:`` unwritten (the default
  ``outputs/``, ``logs/``, ``metrics.jsonl``): its relative paths land in the job's ``code/``
  folder (its working directory) and ``orch fetch`` brings back only what ``outputs:`` selects
  there, by the path written (``code/out/x.pt`` as ``out/x.pt``: ``outputs: [out/]``).

The command is read after its leading ``cd DIR &&`` and ``NAME=value`` (spec/commandform.py):
its names are relative to ``DIR``.

It is conservative: absolute paths (they can exist only on the server), ``~``/``$`` paths, URLs,
paths leaving the workspace, programs found on PATH, a relative python (``.venv/bin/python``),
files whose name the job's ``setup`` mentions (it may make them) and modules that are not the
workspace's (``python -m http.server``) are never flagged; for forms it cannot parse with
certainty it says nothing.
"""

from __future__ import annotations

import dataclasses
import difflib
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

from orchestrator.checks.progress import progress_problems
from orchestrator.checks.traindata import train_inputs
from orchestrator.errors import SpecError
from orchestrator.globs.match import Patterns
from orchestrator.globs.read import PatternError, read
from orchestrator.spec import commandform
from orchestrator.spec.load import LoadedSpec
from orchestrator.sync import excluded
from orchestrator.sync.selection import Chosen, IgnoreRules, Skipped
from remote_payload.contract import precision, zeroconfig

PYTHON_RE = re.compile(r"^python(\d+(\.\d+)?)?$")
SHELLS = frozenset({"bash", "sh", "dash", "zsh"})
# Launcher options that take no value; any other option is assumed to take one (so an unknown
# flag swallows the script and nothing is checked, rather than a value being taken for a script).
TORCHRUN_FLAGS = frozenset({"--standalone", "--run-path", "--run_path", "--virtual-local-rank",
                            "--virtual_local_rank"})
ACCELERATE_FLAGS = frozenset({"--cpu", "--multi_gpu", "--tpu", "--use_deepspeed", "--use_fsdp",
                              "--use_megatron_lm", "--use_xpu", "--debug", "-q", "--quiet"})
# What a path argument of a training command often ends in (data, weights, configs, code).
PATH_EXTS = frozenset({".py", ".sh", ".bin", ".pt", ".pth", ".ckpt", ".safetensors", ".json", ".jsonl", ".yaml",
                       ".yml", ".toml", ".cfg", ".ini", ".txt", ".csv", ".tsv", ".parquet", ".arrow", ".npy", ".npz",
                       ".pkl", ".pickle", ".h5", ".hdf5", ".idx", ".model", ".tar", ".gz", ".zip", ".pb", ".onnx"})
NOT_A_PATH = re.compile(r"[\s'\"`;|&<>()$*?\[\]{}:,]|^-|://")
# An option whose value the job writes: its files are outputs, never inputs to look for.
OUTPUT_OPTION = re.compile(r"^--?(o|out|output|save|log|logging|checkpoint|ckpt|result|dump|export|dest|tensorboard)"
                           r"s?([_-]?(dir|path|folder|root|to|prefix))?$")
DEFAULT_OUTPUTS = ("outputs/", "logs/", "metrics.jsonl")  # spec/model.py's default for outputs:
SHOWN = 3  # names of files in a folder that a warning lists


@dataclass(frozen=True)
class Ref:
    """A workspace file (or module) that ``launch.command`` needs. ``strict``: flag it even when
    it is nowhere on disk (otherwise only when it is there but excluded)."""

    kind: str  # "file" or "module"
    name: str
    index: int  # its argv index
    strict: bool = True


@dataclass(frozen=True)
class PathArg:
    """An argument of ``launch.command`` that reads as a relative path: ``value`` (the whole
    argument, or what follows ``=``), at argv ``index``, of ``option`` (``--data`` for
    ``--data=x`` or ``--data x``; "" for a bare argument)."""

    value: str
    index: int
    option: str = ""

    @property
    def output(self) -> bool:
        return bool(OUTPUT_OPTION.match(self.option))


def laptop_checks(loaded: LoadedSpec) -> None:
    """Raise ``SpecError`` for a missing workspace, a refused precision or a command whose file is not synced."""
    laptop_report(loaded)


def laptop_report(loaded: LoadedSpec, chosen: Chosen | None = None) -> list[str]:
    """``laptop_checks`` (raising the same errors), then the warnings (``file:line:col: field: ...``).
    ``chosen``: the workspace's selection when the caller walks it too (``orch submit``)."""
    refused = precision_problems(loaded) + pattern_problems(loaded)
    if refused:
        raise SpecError("\n".join(refused))
    root = loaded.workspace_dir
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a folder"
        raise SpecError(f"{loaded.locate(('workspace', 'path'))}: workspace.path: {root} {what}")
    refused = deepspeed_problems(loaded)
    if refused:
        raise SpecError("\n".join(refused))
    walked: list[Chosen] = [chosen] if chosen is not None and chosen.root == root else []

    def selection() -> Chosen:
        if not walked:
            walked.append(Chosen(root, loaded.spec.workspace.exclude))
        return walked[0]

    errors, notes = train_inputs(loaded, selection)  # traindata.py: the built-in trainer's data and transform
    if errors:
        raise SpecError("\n".join(errors))
    command = loaded.spec.launch.command
    if not command:
        return notes
    refs, args = _command_paths(list(command))
    warnings = outputs_warnings(loaded, args) + progress_problems(loaded)  # progress.py: launch.progress
    if not refs and not args:
        return warnings
    chosen = selection()
    files = set(chosen.files())
    skipped = chosen.skipped
    rules = skipped.rules
    assert rules is not None
    problems = []
    for ref in refs:
        reason = _module_problem(ref, root, files, rules) if ref.kind == "module" \
            else _file_problem(ref, root, files, rules, loaded)
        if reason:
            problems.append(f"{_at(loaded, ref.index)}: launch.command: {reason}")
    if problems:
        raise SpecError("\n".join(problems))
    notes = [(arg, _arg_note(arg, root, files, skipped, rules, loaded)) for arg in args]
    return [f"{_at(loaded, arg.index)}: launch.command: {note}" for arg, note in notes if note] + warnings


def _command_paths(command: list[str]) -> tuple[list[Ref], list[PathArg]]:
    """``command_refs`` and ``path_args`` of the command less its leading ``cd DIR &&`` and
    ``NAME=value`` (spec/commandform.py), their names relative to the workspace (below ``DIR``;
    nothing under an absolute or ``~`` DIR, which only the server has), their indices the
    command's."""
    form = commandform.read(command)
    argv, start, cwd = list(form.argv), form.start, form.cwd
    if cwd is not None and cwd.startswith(("/", "~")):
        return [], []
    refs = command_refs(argv, start)
    args = [dataclasses.replace(a, index=a.index + start) for a in path_args(argv, {r.index - start for r in refs})]
    if cwd is None:
        return refs, args
    def under(name: str) -> str:
        return name if name.startswith(("/", "~")) or "$" in name else posixpath.normpath(posixpath.join(cwd, name))
    return ([dataclasses.replace(r, name=under(r.name)) for r in refs if r.kind == "file"],
            [dataclasses.replace(a, value=under(a.value)) for a in args])


def _at(loaded: LoadedSpec, index: int) -> str:
    """``file:line:col`` of argv item ``index`` (a list command), else of ``launch.command``."""
    key = ("launch", "command", index)
    return loaded.locate(key if key in loaded.marks else ("launch", "command"))


def pattern_problems(loaded: LoadedSpec) -> list[str]:
    """``file:line:col: workspace.exclude[i]: why`` (and ``outputs[i]``) for each item that is
    not a gitignore pattern (``globs/read.py``: a lone trailing backslash, a backwards range)."""
    out = []
    for field, items in (("workspace.exclude", loaded.spec.workspace.exclude), ("outputs", loaded.spec.outputs)):
        for i, item in enumerate(items):
            try:
                read(item)
            except PatternError as exc:
                out.append(f"{loaded.locate((*field.split('.'), i))}: {field}[{i}]: {exc}")
    return out


def precision_problems(loaded: LoadedSpec) -> list[str]:
    """``file:line:col: train.precision: why`` for each refusal of ``precision.config_problems``."""
    train = loaded.spec.train
    found = precision.config_problems(train.precision, train.strategy) if train else []
    return [f"{loaded.locate(('train', p.field))}: train.{p.field}: {p.message}" for p in found]


def deepspeed_problems(loaded: LoadedSpec) -> list[str]:
    """What is wrong with ``train.deepspeed``'s JSON file (see the module doc); an absolute path is
    the server's and is checked there by the trainer."""
    train = loaded.spec.train
    name = train.deepspeed.config if train and train.deepspeed else None
    if name is None or name.startswith(("/", "~")):
        return []
    key = ("train", "deepspeed", "config")
    at = f"train.deepspeed: {loaded.locate(key if key in loaded.marks else key[:2])}"
    path = loaded.workspace_dir / name
    try:
        text = path.read_text()
    except OSError as exc:
        return [f"{loaded.locate(key if key in loaded.marks else key[:2])}: train.deepspeed: cannot read {name} in the "
                f"workspace ({path}: {exc.strerror or exc})"]
    config, found = zeroconfig.read_json(text)
    if config is not None:
        job = zeroconfig.JobValues(train.batch_size, train.grad_accum, train.max_grad_norm, train.precision)
        found = zeroconfig.problems(config, job, text)
    return [f"{path}:{p.line or 1}{f':{p.column}' if p.column else ''}: {p.key + ': ' if p.key else ''}{p.message} ({at})"
            for p in found]


def command_refs(argv: list[str], offset: int = 0) -> list[Ref]:
    """The workspace files and modules ``argv`` needs (indices shifted by ``offset``)."""
    prog = posixpath.basename(argv[0])
    if PYTHON_RE.match(prog):  # a relative python (.venv/bin/python) may well be made by setup
        return _python(argv, offset)
    refs = [Ref("file", argv[0], offset)] if "/" in argv[0] and not argv[0].startswith("/") else []
    if prog in SHELLS:
        return refs + _shell(argv, offset)
    if prog == "torchrun":
        return refs + _launcher(argv, 1, TORCHRUN_FLAGS, offset)
    if prog == "accelerate" and argv[1:2] == ["launch"]:
        return refs + _launcher(argv, 2, ACCELERATE_FLAGS, offset)
    return refs


def _python(argv: list[str], offset: int) -> list[Ref]:
    target = commandform.python_target(argv)
    if target is None:
        return []
    kind, name, at = target
    return [Ref("module" if kind == "module" else "file", name, offset + at)]


def _shell(argv: list[str], offset: int) -> list[Ref]:
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg in ("--", "-"):
            i += 1
            break
        if arg.startswith("--"):
            i += 2 if arg in ("--rcfile", "--init-file") else 1
            continue
        if arg[:1] not in "-+" or len(arg) == 1:
            break
        if "c" in arg or "s" in arg[1:]:
            return []  # commands from the argument or stdin: no script
        i += 2 if ("o" in arg[1:] or "O" in arg[1:]) else 1
    if i >= len(argv):
        return []
    name = argv[i]
    return [Ref("file", name, offset + i, strict=name.endswith(".sh") or "/" in name)]


def _launcher(argv: list[str], i: int, flags: frozenset[str], offset: int) -> list[Ref]:
    module = no_python = False
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-"):
            break
        if arg in ("-m", "--module"):
            module = True
        elif arg in ("--no-python", "--no_python"):
            no_python = True
        elif "=" not in arg and arg not in flags:
            i += 1  # the option's value
        i += 1
    if i >= len(argv):
        return []
    if no_python:
        return command_refs(argv[i:], offset + i)
    if module:
        return [Ref("module", argv[i], offset + i)]
    return [Ref("file", argv[i], offset + i)] if argv[i].endswith(".py") else []


def path_args(argv: list[str], skip: set[int]) -> list[PathArg]:
    """The arguments of ``argv`` (past the program, leaving out the indices in ``skip``: the
    script or module ``command_refs`` found) that read as relative paths."""
    out = []
    option = ""
    for i, arg in enumerate(argv[1:], start=1):
        given, option = option, ""
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            if not eq:
                option = arg  # its value may be the next argument
                continue
        elif "=" in arg and re.match(r"^[A-Za-z_][\w.-]*=", arg):  # key=value (hydra, nanoGPT's configurator)
            name, _, value = arg.partition("=")
        else:
            name, value = given, arg
        if i not in skip and (_looks_like_path(value) or (OUTPUT_OPTION.match(name) and _looks_like_path(value + "/"))):
            out.append(PathArg(value, i, name))
    return out


def _looks_like_path(value: str) -> bool:
    """A relative path of the workspace, as far as one argument can tell: a ``/`` inside, or
    a known extension; never absolute, ``~``, ``$``, a URL, a glob or shell text."""
    if not value or value.startswith(("/", "~")) or NOT_A_PATH.search(value):
        return False
    rel = posixpath.normpath(value)
    if rel in (".", "..") or rel.startswith("../"):
        return False
    return "/" in value or posixpath.splitext(value)[1].lower() in PATH_EXTS


def _made_by_setup(rel: str, loaded: LoadedSpec) -> bool:
    return posixpath.basename(rel.rstrip("/")) in (loaded.spec.setup or "")


def _file_problem(ref: Ref, root: Path, files: set[str], rules: IgnoreRules, loaded: LoadedSpec) -> str | None:
    if ref.name.startswith(("/", "~")) or "$" in ref.name:
        return None
    rel = posixpath.normpath(ref.name)
    if rel in (".", "..") or rel.startswith("../") or _made_by_setup(rel, loaded):
        return None
    if rel in files or any(f.startswith(rel + "/") for f in files):
        return None
    found = _exclusion(root, rel, rules)
    if found:
        return found.text()
    if not ref.strict or (root / rel).exists() or (root / rel).is_symlink():
        return None
    close = difflib.get_close_matches(rel, sorted(files), n=1, cutoff=0.7)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{ref.name} is not in the workspace {root}{hint}"


def _module_problem(ref: Ref, root: Path, files: set[str], rules: IgnoreRules) -> str | None:
    parts = ref.name.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    base = "/".join(parts)
    wanted = (f"{base}.py", f"{base}/__main__.py")
    if any(w in files for w in wanted):
        return None
    for path in wanted:
        found = _exclusion(root, path, rules)
        if found:
            return f"module {ref.name} ({path}) {found.cause()}; {found.remedy()}"
    top = parts[0]
    ours = f"{top}/__init__.py" in files or (len(parts) > 1 and f"{top}.py" in files)
    if not ours:
        return None  # an installed module (python -m http.server): not the workspace's business
    return f"-m {ref.name} needs {wanted[0]} or {wanted[1]}; the workspace {root} has {top}/ but neither"


def _exclusion(root: Path, rel: str, rules: IgnoreRules) -> excluded.Exclusion | None:
    """Why ``rel``, there on disk under ``root``, is not synced; None when it is not there or not left out."""
    target = root / rel
    if not (target.exists() or target.is_symlink()):
        return None
    return excluded.why(rules, rel, target.is_dir() and not target.is_symlink())


def _arg_note(arg: PathArg, root: Path, files: set[str], skipped: Skipped, rules: IgnoreRules,
              loaded: LoadedSpec) -> str | None:
    """The warning for one path argument, or None."""
    rel = posixpath.normpath(arg.value)
    if arg.output or _made_by_setup(rel, loaded):
        return None  # the job writes it, or setup makes it
    found = _exclusion(root, rel, rules)
    if found is not None:
        return f"{found.text()} (the job will not find it)"
    if (root / rel).is_dir():
        return _folder_note(rel, skipped, rules)
    if rel in files or (root / rel).exists() or (root / rel).is_symlink():
        return None
    known = posixpath.splitext(rel)[1].lower() in PATH_EXTS
    if not known and not (root / rel.split("/")[0]).exists():
        return None  # gpt2/medium, org/model: a name, not a path of this workspace
    others = sorted(files | {e.rel for e in skipped.excluded if not e.rel.endswith("/")})
    close = difflib.get_close_matches(rel, others, n=1, cutoff=0.7)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return (f"{arg.value} is not in the workspace {root}{hint}, nor left out by an ignore rule: the job will "
            f"not find it unless it makes it")


def _folder_note(rel: str, skipped: Skipped, rules: IgnoreRules) -> str | None:
    """A folder argument holding files the rules leave out (caches aside): how many, which
    rules, and the lines that bring them."""
    inside = [e for e in skipped.excluded if e.rel.startswith(rel + "/") and not excluded.is_junk(e.rel)]
    if not inside:
        return None
    found = [x for x in (excluded.why(rules, e.rel.rstrip("/"), e.rel.endswith("/")) for e in inside[:50]) if x]
    names = [e.rel[len(rel) + 1:] for e in inside]
    listed = ", ".join(names[:SHOWN]) + (f" +{len(names) - SHOWN} more" if len(names) > SHOWN else "")
    folders = sum(1 for e in inside if e.rel.endswith("/"))
    count = " and ".join(part for part in (f"{len(inside) - folders} file(s)" if len(inside) > folders else "",
                                           f"{folders} folder(s)" if folders else "") if part)
    by = ", ".join(dict.fromkeys(str(x.rule) for x in found if x.rule))
    fix = excluded.fix_for(found)
    drop = tuple(dict.fromkeys(p for x in found for p in x.drop))
    remedy = excluded.Exclusion(rel, rel, None, fix, drop).remedy() if fix or drop else "change those rules"
    return (f"{rel}/ holds {count} that are not synced ({listed}), excluded by {by}; {remedy} "
            f"(the job will not find them)")


def outputs_warnings(loaded: LoadedSpec, args: list[PathArg]) -> list[str]:
    """What ``orch fetch`` would miss of a ``launch.command`` job: an output option's relative
    path that ``outputs:`` does not select, or, without one, ``outputs:`` left unwritten."""
    outputs = list(loaded.spec.outputs)
    select = Patterns(outputs)
    shown = ", ".join(outputs) or "nothing"
    out = []
    for arg in args:
        if not arg.output:
            continue
        rel = posixpath.normpath(arg.value)
        folder = rel.rstrip("/") + "/"
        if select.match(rel) or select.match(folder + "x"):
            continue
        wanted = folder if not posixpath.splitext(rel)[1] else rel
        out.append(f"{_at(loaded, arg.index)}: outputs: the job writes {arg.value} ({arg.option}) in its working "
                   f"directory (code/), which outputs: ({shown}) does not select, so orch fetch will not bring it "
                   f"back: add {wanted!r} to outputs:")
    if out or ("outputs",) in loaded.marks or tuple(outputs) != DEFAULT_OUTPUTS:
        return out
    return [f"{loaded.locate(('launch', 'command'))}: outputs: is the default ({shown}): the script runs in the "
            "job's code/ folder, and what it writes to a relative path (out/ckpt.pt) is fetched only if outputs: "
            "names it by that path: write outputs: in the job file, e.g. outputs: [out/, logs/, metrics.jsonl]"]

"""What the laptop can know is wrong with a job before connecting anywhere.

``laptop_checks`` runs in ``orch check`` and, before it connects, in ``orch submit``. It raises
``SpecError`` (exit 2) naming ``file:line:col`` of the field when

- ``workspace.path`` does not exist or is not a folder (the message shows the resolved path);
- ``train.precision`` is one that remote_payload/contract/precision.py refuses with ``train.strategy``
  (fsdp with fp16): the same rules the trainer applies on the server, found before the sync;
- ``launch.command`` runs a file of the workspace that will not be synced: the script of
  ``python [opts] X``, ``bash|sh [opts] X.sh``, ``torchrun``/``accelerate launch [opts] X.py``,
  a relative program such as ``./run.sh``, or a module of the workspace (``python -m pkg.mod``
  needs ``pkg/mod.py`` or ``pkg/mod/__main__.py``). A file that is there but excluded names the
  rule that excluded it and where that rule is written (.gitignore, .orchignore, workspace.exclude).

It is conservative: absolute paths, ``~``/``$`` paths, paths leaving the workspace, programs
found on PATH, a relative python (``.venv/bin/python``), files whose name the job's ``setup``
mentions (it may make them) and modules that are not the workspace's (``python -m
http.server``) are never flagged; for forms it cannot parse with certainty it says nothing.
"""

from __future__ import annotations

import difflib
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import SpecError
from orchestrator.spec.load import LoadedSpec
from orchestrator.sync.selection import ignore_spec, select_files
from remote_payload.contract import precision

PYTHON_RE = re.compile(r"^python(\d+(\.\d+)?)?$")
SHELLS = frozenset({"bash", "sh", "dash", "zsh"})
# Launcher options that take no value; any other option is assumed to take one (so an unknown
# flag swallows the script and nothing is checked, rather than a value being taken for a script).
TORCHRUN_FLAGS = frozenset({"--standalone", "--run-path", "--run_path", "--virtual-local-rank",
                            "--virtual_local_rank"})
ACCELERATE_FLAGS = frozenset({"--cpu", "--multi_gpu", "--tpu", "--use_deepspeed", "--use_fsdp",
                              "--use_megatron_lm", "--use_xpu", "--debug", "-q", "--quiet"})
IGNORE_FILES = (".gitignore", ".orchignore")  # in the order sync.ignore_spec reads them


@dataclass(frozen=True)
class Ref:
    """A workspace file (or module) that ``launch.command`` needs. ``strict``: flag it even when
    it is nowhere on disk (otherwise only when it is there but excluded)."""

    kind: str  # "file" or "module"
    name: str
    index: int  # its argv index
    strict: bool = True


def laptop_checks(loaded: LoadedSpec) -> None:
    """Raise ``SpecError`` for a missing workspace, a refused precision or a command whose file is not synced."""
    refused = precision_problems(loaded)
    if refused:
        raise SpecError("\n".join(refused))
    root = loaded.workspace_dir
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a folder"
        raise SpecError(f"{loaded.locate(('workspace', 'path'))}: workspace.path: {root} {what}")
    command = loaded.spec.launch.command
    refs = command_refs(command) if command else []
    if not refs:
        return
    files = set(select_files(root, loaded.spec.workspace.exclude))
    problems = []
    for ref in refs:
        reason = _module_problem(ref, root, files, loaded) if ref.kind == "module" \
            else _file_problem(ref, root, files, loaded)
        if reason:
            at = ("launch", "command", ref.index) if ("launch", "command", ref.index) in loaded.marks \
                else ("launch", "command")
            problems.append(f"{loaded.locate(at)}: launch.command: {reason}")
    if problems:
        raise SpecError("\n".join(problems))


def precision_problems(loaded: LoadedSpec) -> list[str]:
    """``file:line:col: train.precision: why`` for each refusal of ``precision.config_problems``."""
    train = loaded.spec.train
    found = precision.config_problems(train.precision, train.strategy) if train else []
    return [f"{loaded.locate(('train', p.field))}: train.{p.field}: {p.message}" for p in found]


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
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg == "-" or arg in ("--help", "--version"):
            return []
        if arg.startswith("--"):
            i += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        if not arg.startswith("-"):
            break
        for j, flag in enumerate(arg[1:], start=2):
            if flag in "hV?":
                return []
            if flag in "cmWX":
                value = arg[j:] or (argv[i + 1] if i + 1 < len(argv) else "")
                if flag == "c":
                    return []
                if flag == "m":
                    return [Ref("module", value, offset + i + (0 if arg[j:] else 1))] if value else []
                i += 0 if arg[j:] else 1
                break
        i += 1
    return [Ref("file", argv[i], offset + i)] if i < len(argv) else []


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


def _file_problem(ref: Ref, root: Path, files: set[str], loaded: LoadedSpec) -> str | None:
    if ref.name.startswith(("/", "~")) or "$" in ref.name:
        return None
    rel = posixpath.normpath(ref.name)
    if rel in (".", "..") or rel.startswith("../") or posixpath.basename(rel) in (loaded.spec.setup or ""):
        return None
    if rel in files or any(f.startswith(rel + "/") for f in files):
        return None
    excluded = exclusion(root, rel, loaded)
    if excluded:
        return f"{ref.name} is not synced: {excluded}"
    if not ref.strict or (root / rel).exists() or (root / rel).is_symlink():
        return None
    close = difflib.get_close_matches(rel, sorted(files), n=1, cutoff=0.7)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{ref.name} is not in the workspace {root}{hint}"


def _module_problem(ref: Ref, root: Path, files: set[str], loaded: LoadedSpec) -> str | None:
    parts = ref.name.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    base = "/".join(parts)
    wanted = (f"{base}.py", f"{base}/__main__.py")
    if any(w in files for w in wanted):
        return None
    for path in wanted:
        excluded = exclusion(root, path, loaded)
        if excluded:
            return f"module {ref.name} ({path}) is not synced: {excluded}"
    top = parts[0]
    ours = f"{top}/__init__.py" in files or (len(parts) > 1 and f"{top}.py" in files)
    if not ours:
        return None  # an installed module (python -m http.server): not the workspace's business
    return f"-m {ref.name} needs {wanted[0]} or {wanted[1]}; the workspace {root} has {top}/ but neither"


def exclusion(root: Path, rel: str, loaded: LoadedSpec) -> str | None:
    """Why ``rel`` (a POSIX path under ``root``, there on disk) is left out of the sync, naming
    the deciding rule and where it is written; ``None`` when it is not there or not excluded.
    Like ``sync.select_files``, a folder that is excluded excludes everything under it."""
    target = root / rel
    if not (target.exists() or target.is_symlink()):
        return None
    parts = rel.split("/")
    spec = ignore_spec(root, loaded.spec.workspace.exclude)
    for n in range(1, len(parts) + 1):
        sub = "/".join(parts[:n])
        is_dir = n < len(parts) or target.is_dir()
        if is_dir and parts[n - 1] == ".git":
            return "a .git folder is never synced"
        result = spec.check_file(sub + "/" if is_dir else sub)
        if result.include:
            what = f"its folder {sub}/ is" if n < len(parts) else "it is"
            return f"{what} excluded by {_rule(root, result.index, loaded)}"
    return None


def _rule(root: Path, index: int | None, loaded: LoadedSpec) -> str:
    """``'data/' (.gitignore line 3)``: the pattern at ``index`` of ``sync.ignore_spec``'s
    list (.gitignore lines, then .orchignore lines, then workspace.exclude)."""
    sources: list[tuple[str, str]] = []
    for name in IGNORE_FILES:
        path = root / name
        if path.is_file():
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            sources += [(line, f"{name} line {n}") for n, line in enumerate(lines, start=1)]
    for n, pattern in enumerate(loaded.spec.workspace.exclude):
        line = loaded.marks.get(("workspace", "exclude", n), loaded.marks.get(("workspace", "exclude"), (0, 0)))[0]
        sources.append((pattern, "workspace.exclude" + (f", line {line} of the job file" if line else "")))
    if index is None or not 0 <= index < len(sources):
        return "a rule of .gitignore, .orchignore or workspace.exclude"
    pattern, where = sources[index]
    return f"{pattern.strip()!r} ({where})"

"""Pure: the shell forms ``launch.command`` may start with, which orch applies itself.

The command runs as one argv (no shell reads it on the server), so a shell's ``cd DIR &&``
or ``A=1`` in front of it would reach the server as a program named ``cd`` or ``A=1``. orch
takes them off instead (``read``), in any order and repeated, before the program:

- ``cd DIR &&`` (or ``cd DIR;``): the job runs in ``DIR`` — relative to its working folder
  (``<job_dir>/code``, the workspace), or absolute; ``~`` is the server's home;
- ``NAME=value`` and ``env NAME=value ...``: ``NAME`` is set in the job's environment, as if
  written in ``env:`` after its own entries (the same ``$NAME`` rules apply: ``envvars``);
- ``exec`` and ``nohup``: nothing to do (the supervisor runs the program and keeps it attached).

A shell operator (``&&``, ``;``, ``|``, ``||``, ``&``) or a redirection (``>``, ``2>&1``, ``<``)
anywhere else would reach the program as an argument: ``read`` refuses it (``ValueError``,
which job.yaml's loader shows at ``launch.command``), naming what orch runs instead.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from remote_payload.contract import envvars

ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
OPERATORS = frozenset({"&&", "||", ";", ";;", "|", "|&", "&"})
# Only words that cannot be an argument (`<pad>`, `>=2.0` can): `>`, `2>>`, `&>`, `2>&1`, `2>err.log`, `<`.
REDIRECTION = re.compile(r"^(\d*>>?|&>>?|\d*>&\d+|\d+>>?[^&<>=]\S*|<<?)$")
PASSTHROUGH = frozenset({"exec", "nohup"})
FORMS = "orch reads a leading `cd DIR &&`, `NAME=value`, `env NAME=value`, `exec` and `nohup` itself"


@dataclass(frozen=True)
class Form:
    """A command less its leading shell forms: ``argv`` (the program and its arguments) starts
    at index ``start`` of the command as written; ``env`` in their order; ``cwd`` as written
    (joined when there are several ``cd``), None for the job's working folder."""

    argv: tuple[str, ...]
    start: int = 0
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None


def read(command: list[str]) -> Form:
    """``command`` less its leading ``cd DIR &&``, ``NAME=value``, ``env NAME=value``, ``exec``
    and ``nohup``. ``ValueError`` (the whole message) for a shell operator or redirection
    elsewhere, a ``cd`` orch cannot apply, ``env`` with options, or nothing left to run."""
    i, n = 0, len(command)
    env: list[tuple[str, str]] = []
    cwd: str | None = None
    pending = False  # NAME=value words since the last cd (a shell gives them to the next program)
    while i < n:
        word = command[i]
        if word == "cd":
            if pending:
                raise ValueError("`NAME=value cd DIR`: a shell gives NAME to cd only; write `cd DIR && NAME=value "
                                 "COMMAND`")
            folder, i = _cd(command, i)
            cwd = posixpath.join(cwd, folder) if cwd is not None else folder
            continue
        found = ASSIGNMENT.match(word)
        if found:
            env.append(_assignment(found.group(1), found.group(2)))
            pending, i = True, i + 1
            continue
        if word == "env":
            i += 1
            while i < n and ASSIGNMENT.match(command[i]):
                found = ASSIGNMENT.match(command[i])
                assert found is not None
                env.append(_assignment(found.group(1), found.group(2)))
                i += 1
            if i < n and command[i].startswith("-"):
                raise ValueError(f"`env {command[i]}`: orch does not read env's options; {FORMS} (an `env:` entry "
                                 "sets a variable, and there is no way to unset one)")
            pending = True
            continue
        if word in PASSTHROUGH:
            if i + 1 < n and command[i + 1].startswith("-"):
                raise ValueError(f"`{word} {command[i + 1]}`: orch does not read {word}'s options; {FORMS}")
            i += 1
            continue
        break
    if i >= n:
        raise ValueError(f"names no program to run after {' '.join(command)!r}")
    argv = command[i:]
    _no_shell_syntax(argv)
    return Form(tuple(argv), i, tuple(env), cwd)


def _cd(command: list[str], i: int) -> tuple[str, int]:
    """The folder of the ``cd`` at ``i`` and the index after its ``&&``."""
    rest = command[i + 1:i + 3]
    if rest and len(rest[0]) > 1 and rest[0].endswith(";"):
        folder, after = rest[0][:-1], i + 2
    elif len(rest) == 2 and rest[1] in ("&&", ";"):
        folder, after = rest[0], i + 3
    else:
        raise ValueError("`cd` must be followed by a folder, `&&` and the command: orch runs `cd DIR && COMMAND` "
                         "in DIR")
    if folder.startswith("-") or folder == "":
        raise ValueError(f"`cd {folder}`: write the folder, relative to the workspace or absolute")
    if "$" in folder or (folder.startswith("~") and folder != "~" and not folder.startswith("~/")):
        raise ValueError(f"`cd {folder}`: orch cannot expand that; write the folder relative to the workspace, "
                         "absolute, or under ~/")
    if after >= len(command):
        raise ValueError(f"`cd {folder} &&` names no command to run")
    return folder, after


def _assignment(name: str, value: str) -> tuple[str, str]:
    why = envvars.reserved(name) or envvars.problem(value) or ("contains a NUL byte" if "\x00" in value else None)
    if why:
        raise ValueError(f"`{name}=...` in front of the command: {why}")
    return name, value


def _no_shell_syntax(argv: list[str]) -> None:
    for at, word in enumerate(argv):
        if word in OPERATORS or REDIRECTION.match(word) or (len(word) > 1 and word.endswith(";")
                                                            and not any(c.isspace() for c in word)):
            before = " ".join(argv[:at]) or word
            raise ValueError(
                f"`{word}` after `{before}`: launch.command runs one program as an argv (no shell reads it on the "
                f"server), so `{word}` would reach it as an argument. {FORMS}; for more, run a shell yourself "
                f"(`bash -c '...'`, or a script in the workspace) or put preparation steps in setup: (orch logs the "
                f"output itself)")


def python_target(argv: list[str]) -> tuple[str, str, int] | None:
    """What ``python [options] ...`` (``argv[0]`` a python) runs, read as python reads its own
    options: ``("module", NAME, i)`` for ``-m NAME`` / ``-mNAME``, ``("script", PATH, i)`` for a
    script, ``i`` the index of the word that holds it; None for ``-c``, ``-`` (stdin),
    ``--help``/``-h``/``--version``/``-V`` or nothing to run."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if arg == "-" or arg in ("--help", "--version"):
            return None
        if arg.startswith("--"):
            i += 2 if arg == "--check-hash-based-pycs" else 1
            continue
        if not arg.startswith("-"):
            break
        for j, flag in enumerate(arg[1:], start=2):
            if flag in "hV?":
                return None
            if flag in "cmWX":
                value = arg[j:] or (argv[i + 1] if i + 1 < len(argv) else "")
                if flag == "c":
                    return None
                if flag == "m":
                    return ("module", value, i + (0 if arg[j:] else 1)) if value else None
                i += 0 if arg[j:] else 1
                break
        i += 1
    return ("script", argv[i], i) if i < len(argv) else None

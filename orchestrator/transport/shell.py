"""The one place where argv lists become shell text.

Every command that crosses SSH is an argv list until it reaches ``join``; nothing in orch
formats shell text from strings by hand. The one shell line orch runs as it is, a person's
own (``orch exec HOST -- 'a | b'``), is told apart from an argv here too (``user_argv``).
"""

from __future__ import annotations

import shlex
from typing import Sequence


def join(argv: Sequence[str]) -> str:
    """Quote ``argv`` so that a POSIX shell hands exactly these words to ``execve``."""
    if not argv:
        raise ValueError("empty argv")
    for word in argv:
        if not isinstance(word, str):
            raise TypeError(f"argv word must be str, got {type(word).__name__}")
        if "\x00" in word:
            raise ValueError("argv word contains a NUL byte")
    return " ".join(shlex.quote(word) for word in argv)


def login_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` run through ``bash -l`` (so conda's PATH and the profile's variables are
    there). ``exec`` replaces the shell, so signals and the exit code belong to the command."""
    return ["bash", "-lc", "exec " + join(argv)]


def is_shell_line(words: Sequence[str]) -> bool:
    """One argument that a shell would have to quote (a space, ``|``, ``;``, ``&&``, ``>``,
    ``$``, quotes, globs …) is a shell command line; a single plain word is a program, and
    several arguments are an argv, passed on as they are."""
    return len(words) == 1 and shlex.quote(words[0]) != words[0]


def user_argv(words: Sequence[str], local: bool) -> list[str]:
    """What runs for a person's command (``orch exec``): a shell line under ``bash -c``
    (``bash -lc`` on an SSH host: the login shell, so conda's PATH applies); an argv as it is
    (``exec``-ed by a login shell on SSH, ``login_argv``)."""
    if is_shell_line(words):
        return ["bash", "-c" if local else "-lc", words[0]]
    return list(words) if local else login_argv(words)

"""The one place where argv lists become shell text.

Every command that crosses SSH is an argv list until it reaches ``join``; nothing in orch
formats shell text from strings by hand.
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

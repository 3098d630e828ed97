"""A yes/no question to a person at a terminal, for the few decisions a command may ask about
(trusting a new host key, copying a move server to server).

``confirm`` asks only when both stdin and stderr are terminals; otherwise it returns None and
the caller keeps its non-interactive answer. The question reads like click's: ``TEXT [y/N]: ``
on stderr, ``y``/``yes``/``n``/``no`` in any case, an empty answer takes the default, anything
else asks again. End of input or Ctrl-C is ``KeyboardInterrupt`` (the CLI: ``interrupted``,
exit 130). Standard library only: click stays in ``orchestrator.cli``.

``relay``: where a command runs away from the terminal (on the warm server,
``orchestrator/warm/``), the function that has the question asked where the terminal is.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

Relay = Callable[[str, bool], Optional[bool]]
relay: Relay | None = None


def confirm(question: str, default: bool) -> bool | None:
    """The person's answer to ``question``, or None when nobody is at a terminal."""
    if relay is not None:
        return relay(question, default)
    if not (sys.stdin.isatty() and sys.stderr.isatty()):
        return None
    choices = "Y/n" if default else "y/N"
    while True:
        sys.stderr.write(f"{question} [{choices}]: ")
        sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:
            raise KeyboardInterrupt
        answer = line.strip().lower()
        if answer in ("y", "yes"):
            return True
        if answer in ("n", "no"):
            return False
        if answer == "":
            return default
        sys.stderr.write("Error: invalid input\n")

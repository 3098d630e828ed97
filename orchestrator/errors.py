"""Every error a user can see, each with its exit code (README: exit codes).

Commands raise these; ``orchestrator.cli.main`` is the one place that turns them into a
message and an exit code. Nothing else prints tracebacks.
"""

from __future__ import annotations

import shlex

RAN_MAX_CHARS = 160      # what a CommandFailed message shows of the command that ran
WORD_MAX_CHARS = 60      # a longer argv word (a script, a JSON blob) is shown as a placeholder


class OrchError(Exception):
    """Base class: ``str(err)`` is the whole message shown to the user."""

    exit_code = 4


class JobFailed(OrchError):
    """The job itself ended in a failed (or cancelled, lost) state."""

    exit_code = 1


class UsageError(OrchError):
    """Invalid input: arguments, names, files that do not exist."""

    exit_code = 2


class SpecError(UsageError):
    """An invalid job.yaml; the message names file:line:column and the field path."""


class LocalFileError(UsageError):
    """A file on the laptop stops the command before anything is launched or renamed: a
    damaged ``registry.db``, a broken ``hosts/*.json``, a fetch destination that cannot be
    written (the disk is full). One line: the file, what is wrong, and the fix. Exit 2: the
    fix is on the laptop, like any other invalid input."""


class HostError(OrchError):
    """Cannot reach or authenticate to a host, or its key is not trusted."""

    exit_code = 3


class HostKeyError(HostError):
    """The host's key is unknown (and not trusted) or differs from the pinned one."""


class RemoteError(OrchError):
    """A step on the host failed (setup, sync, launch, a remote helper)."""

    exit_code = 4


class RootNotWritable(RemoteError):
    """orch's root folder on a host cannot be created or written (a non-root login, a
    read-only or missing data disk). One line: the path, the reason, and the fix (``--root``)."""

    def __init__(self, host: str, path: str, reason: str, configured: str) -> None:
        self.host, self.path, self.reason = host, path, reason
        example = "/tmp/orch" if configured.rstrip("/") == "~/orch" else "~/orch"
        super().__init__(f"{host}: cannot write {path} ({reason}): pass --root to a writable folder, "
                         f"e.g. orch hosts add {host} ... --root {example}")


class NotSaved(OrchError):
    """``orch hosts add`` failed before it saved anything: the cause's message and exit code,
    and a line saying the inventory was left as it was."""

    def __init__(self, cause: OrchError, name: str, had_entry: bool, hint: str | None = None) -> None:
        self.cause = cause
        self.exit_code = cause.exit_code
        kept = (f"{name} was not updated: its previous entry is unchanged" if had_entry else
                f"{name} was not saved")
        super().__init__(f"{cause}\n{kept}; " + (hint or "fix the problem and run the same `orch hosts add` again"))


def short_command(command: str, limit: int = RAN_MAX_CHARS) -> str:
    """A one-line summary of a quoted command for messages: a word that spans lines (the
    helper's source, a script) becomes ``<script, N lines>``, a long one ``<N chars>``; the
    command word of ``bash -lc``/``sh -c`` is summarised the same way inside; at most
    ``limit`` characters. For showing only, never for running."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = [command]
    text = " ".join(_summarise(words, 0))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _summarise(words: list[str], depth: int) -> list[str]:
    out: list[str] = []
    shell = bool(words) and words[0].rsplit("/", 1)[-1] in ("bash", "sh")
    for i, word in enumerate(words):
        if shell and depth < 2 and i > 0 and words[i - 1] in ("-c", "-lc"):
            try:
                out.append(shlex.quote(" ".join(_summarise(shlex.split(word), depth + 1))))
                continue
            except ValueError:
                pass
        if "\n" in word:
            out.append(f"<script, {word.count(chr(10)) + 1} lines>")
        elif len(word) > WORD_MAX_CHARS:
            out.append(f"<{len(word)} chars>")
        else:
            out.append(shlex.quote(word))
    return out


class CommandFailed(RemoteError):
    """A remote command exited non-zero; carries the ``Result`` for the message. The
    command is shown summarised (``short_command``): never a helper's whole source."""

    def __init__(self, result: "object", what: str = "") -> None:
        from orchestrator.transport.base import Result  # local: avoid an import cycle

        assert isinstance(result, Result)
        self.result = result
        tail = (result.stderr or result.stdout).decode("utf-8", "replace").strip().splitlines()[-8:]
        head = f"{what} failed" if what else "remote command failed"
        lines = [f"{head} on {result.host} (exit {result.exit_code})", f"  ran: {short_command(result.command)}"]
        lines += [f"  | {line}" for line in tail]
        super().__init__("\n".join(lines))

"""Every error a user can see, each with its exit code (DESIGN.md: CLI contract).

Commands raise these; ``orchestrator.cli.main`` is the one place that turns them into a
message and an exit code. Nothing else prints tracebacks.
"""

from __future__ import annotations


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


class HostError(OrchError):
    """Cannot reach or authenticate to a host, or its key is not trusted."""

    exit_code = 3


class HostKeyError(HostError):
    """The host's key is unknown (and not trusted) or differs from the pinned one."""


class RemoteError(OrchError):
    """A step on the host failed (setup, sync, launch, a remote helper)."""

    exit_code = 4


class CommandFailed(RemoteError):
    """A remote command exited non-zero; carries the ``Result`` for the message."""

    def __init__(self, result: "object", what: str = "") -> None:
        from orchestrator.transport.base import Result  # local: avoid an import cycle

        assert isinstance(result, Result)
        self.result = result
        tail = (result.stderr or result.stdout).decode("utf-8", "replace").strip().splitlines()[-8:]
        head = f"{what} failed" if what else "remote command failed"
        lines = [f"{head} on {result.host} (exit {result.exit_code})", f"  ran: {result.command}"]
        lines += [f"  | {line}" for line in tail]
        super().__init__("\n".join(lines))

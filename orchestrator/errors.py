"""Every error a user can see, each with its exit code (README: exit codes).

Commands raise these; ``orchestrator.cli.main`` is the one place that turns them into a
message and an exit code. Nothing else prints tracebacks.
"""

from __future__ import annotations


class OrchError(Exception):
    """Base class: ``str(err)`` is the whole message shown to the user."""

    exit_code = 4


class UsageError(OrchError):
    """Invalid input: arguments, names, files that do not exist."""

    exit_code = 2


class SpecError(UsageError):
    """An invalid job.yaml; the message names file:line:column and the field path."""


class SettingError(UsageError):
    """An ``ORCH_*`` environment variable whose value cannot be read (``orchestrator/settings.py``):
    the message names the variable, its value and what it takes."""


class LocalFileError(UsageError):
    """A file on the laptop stops the command before anything is launched or renamed: a
    damaged ``registry.db``, a broken ``hosts/*.json``, a fetch destination that cannot be
    written (the disk is full). One line: the file, what is wrong, and the fix. Exit 2: the
    fix is on the laptop, like any other invalid input."""


class LocalBusy(LocalFileError):
    """``ORCH_HOME/registry.db`` stayed locked by another orch process past the wait
    (``state/db.py``): the message names the file and how to find and free the holder."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with what the interrupted step kept (``str(err)``, one line, may be empty).
    A ``KeyboardInterrupt``, so no ``except Exception`` swallows it; exit 130."""


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


class SweepIncomplete(OrchError):
    """Some combinations of a sweep did not start (the others did): the message names each
    with its reason and the command that submits exactly those; the exit code is the one
    of the cause (docs/sweeps.md: 130 interrupted, 3 a host unreachable, else the first's)."""

    def __init__(self, message: str, exit_code: int) -> None:
        self.exit_code = exit_code
        super().__init__(message)


class NotSaved(OrchError):
    """``orch hosts add`` failed before it saved anything: the cause's message and exit code,
    and a line saying the inventory was left as it was."""

    def __init__(self, cause: OrchError, name: str, had_entry: bool, hint: str | None = None) -> None:
        self.cause = cause
        self.exit_code = cause.exit_code
        kept = (f"{name} was not updated: its previous entry is unchanged" if had_entry else
                f"{name} was not saved")
        super().__init__(f"{cause}\n{kept}; " + (hint or "fix the problem and run the same `orch hosts add` again"))

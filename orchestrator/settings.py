"""Every ``ORCH_*`` environment variable the laptop side reads, in one place: its name (a time
ends in ``_S``, seconds; a size in ``_MB``), default, what it takes and what it does.
docs/configuration.md is this table in words (tests/test_settings.py checks that they agree and
that no other laptop module reads an ``ORCH_`` variable).

Contracts:

- A setting is read when it is used, not when a module is imported: a notebook that sets
  ``os.environ`` before a call is heard, and nothing is read before ``orch`` can report it.
- A value that cannot be read (``ORCH_CONNECT_TIMEOUT_S=ten``, a negative time, a flag that is
  neither on nor off) raises ``SettingError`` (exit 2) naming the variable, the value and what
  it takes; never a silent default. ``orch`` checks every setting before a command runs
  (``check_all``), so the background processes it starts (connection holders, the warm server)
  never meet one; ``Setting.lenient`` is for the error path itself (``ORCH_DEBUG``).
- A renamed variable's old name still works while the new one is unset, with one
  ``RenamedSetting`` warning (a ``FutureWarning``: shown by default) per process naming the new.
- Set and empty is the same as unset.
- ``HANDOFF`` names are not settings: orch sets them for a background process it starts, which
  takes them out of its environment at once (``take``).

Standard library only and cheap to import: the ``orch`` entry point reads ``ORCH_WARM`` and
``ORCH_HOME`` through it before anything else. The server side's own variables live in
``remote_payload/contract/settings.py``.
"""

from __future__ import annotations

import os
import warnings

from orchestrator.errors import SettingError

TYPE_CHECKING = False  # typing costs every command's start ~9 ms (orch's entry point imports this)
if TYPE_CHECKING:
    from typing import Union

    Value = Union[float, int, bool, str, None]

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")
_TAKES = {
    "seconds": "a number of seconds, e.g. 30 or 0.5",
    "megabytes": "a whole number of megabytes, e.g. 500",
    "count": "a whole number, at least 1",
    "flag": "1 or 0 (or true/false, yes/no, on/off)",
    "text": "any text",
    "path": "a folder path",
}


class RenamedSetting(FutureWarning):
    """An ``ORCH_`` variable was set under its old name (``Setting.old``)."""


class Setting:
    """One ``ORCH_`` environment variable of the laptop side.

    ``kind`` is one of ``_TAKES``: ``seconds`` (a float; ``minimum`` is the least allowed,
    default just above 0), ``megabytes`` (an int >= 0), ``count`` (an int >= 1), ``flag`` (a bool),
    ``text`` and ``path`` (a str). ``default`` is the parsed value when unset (None: no value,
    the caller decides); ``shown_default`` is how docs/configuration.md states it. ``old`` are
    earlier names still read. ``purpose`` is one sentence for the docs; ``for_tests`` marks a
    hook only orch's own test harness sets."""

    __slots__ = ("name", "kind", "default", "shown_default", "purpose", "old", "minimum", "for_tests")

    def __init__(self, name: str, kind: str, default: Value, purpose: str, *, old: tuple[str, ...] = (),
                 minimum: float | None = None, shown_default: str | None = None, for_tests: bool = False) -> None:
        assert kind in _TAKES, kind
        self.name, self.kind, self.default, self.purpose, self.old = name, kind, default, purpose, old
        self.minimum, self.for_tests = minimum, for_tests
        self.shown_default = shown_default if shown_default is not None else ("" if default is None else (
            ("1" if default else "0") if kind == "flag" else f"{default:g}" if isinstance(default, float) else str(default)))

    def raw(self) -> str:
        """The variable's text (under an old name, warned once), or "" when unset."""
        value = os.environ.get(self.name, "")
        if value:
            return value
        for old in self.old:
            value = os.environ.get(old, "")
            if value:
                _warn_once(old, f"{old} is now called {self.name}; {old} still works for now, "
                                f"set {self.name} instead")
                return value
        return ""

    def get(self) -> Value:
        """The parsed value, ``default`` when unset; ``SettingError`` (exit 2) when unreadable."""
        text = self.raw().strip()
        if not text:
            return self.default
        value = self._parse(text)
        if value is None:
            shown = self.name if os.environ.get(self.name, "") else next(o for o in self.old if os.environ.get(o, ""))
            raise SettingError(f"{shown}={text!r} in the environment: it takes {self.takes()}; unset it for "
                               f"the default{f' ({self.shown_default})' if self.shown_default else ''}")
        return value

    def seconds(self) -> float:
        """``get`` of a ``seconds`` setting that has a default."""
        return float(self.get())  # type: ignore[arg-type]

    def whole(self) -> int:
        """``get`` of a ``megabytes`` or ``count`` setting."""
        return int(self.get())  # type: ignore[arg-type]

    def on(self) -> bool:
        """``get`` of a ``flag`` setting that has a default."""
        return bool(self.get())

    def lenient(self) -> Value:
        """``get`` that never raises: an unreadable value is the default (for the error path)."""
        try:
            return self.get()
        except SettingError:
            return self.default

    def takes(self) -> str:
        """What the variable takes, in words."""
        if self.kind == "seconds" and self.minimum is not None:
            return f"a number of seconds, at least {self.minimum:g}"
        return _TAKES[self.kind]

    def _parse(self, text: str) -> Value:
        """The value of ``text``, or None when it is not one of this kind's."""
        if self.kind == "seconds":
            try:
                number = float(text)
            except ValueError:
                return None
            ok = number >= self.minimum if self.minimum is not None else number > 0
            return number if ok and number != float("inf") else None
        if self.kind in ("megabytes", "count"):
            try:
                whole = int(text)
            except ValueError:
                return None
            return whole if whole >= (1 if self.kind == "count" else 0) else None
        if self.kind == "flag":
            lowered = text.lower()
            return True if lowered in ON else False if lowered in OFF else None
        return text


_WARNED: set[str] = set()


def _warn_once(name: str, message: str) -> None:
    if name not in _WARNED:
        _WARNED.add(name)
        warnings.warn(message, RenamedSetting, stacklevel=4)


# --- where orch keeps its state, and how it reports --------------------------------------
HOME = Setting("ORCH_HOME", "path", None, "The folder of orch's own state on this laptop: hosts, the job "
               "registry, keys, logs cache.", shown_default="~/.local/share/orch (macOS: ~/Library/Application "
               "Support/orch)")
DEBUG = Setting("ORCH_DEBUG", "flag", False, "Show the Python traceback of an error instead of its one line.")
TRACE = Setting("ORCH_TRACE", "text", "", "1: one timestamped line per phase of a command on stderr; a path: "
                "those lines appended to that file (docs/troubleshooting.md).")
NOTIFY = Setting("ORCH_NOTIFY", "flag", False, "As --notify on every command that has it: a desktop "
                 "notification when a followed job ends (docs/notifications.md).")

# --- background processes on the laptop (docs/connections.md) -----------------------------
WARM = Setting("ORCH_WARM", "flag", None, "The warm server that runs commands without Python's start-up cost: "
               "0 turns it off; 1 turns it on where it is off by default (macOS).",
               shown_default="on on Linux, off elsewhere")
WARM_IDLE = Setting("ORCH_WARM_IDLE_S", "seconds", 600.0, "The warm server exits after this long without a command.")
HOLD = Setting("ORCH_HOLD", "flag", True, "0: no connection holders; every command opens its own SSH connections.")
HOLD_IDLE = Setting("ORCH_HOLD_IDLE_S", "seconds", 600.0, "A connection holder exits after this long with no command "
                    "using it.")
HOLD_SPARE = Setting("ORCH_HOLD_SPARE_S", "seconds", None, "A spare SSH channel a holder keeps ready is dropped after "
                     "this long unused.", shown_default="ORCH_HOLD_IDLE_S")

# --- SSH -----------------------------------------------------------------------------------
CONNECT_TIMEOUT = Setting("ORCH_CONNECT_TIMEOUT_S", "seconds", 10.0, "How long one SSH connection attempt (TCP, "
                          "banner, authentication) may take.", old=("ORCH_CONNECT_TIMEOUT",))
CONNECT_ATTEMPTS = Setting("ORCH_CONNECT_ATTEMPTS", "count", 3, "SSH connection attempts before a host is reported "
                           "unreachable (exit 3).")
KEEPALIVE = Setting("ORCH_KEEPALIVE_S", "seconds", 10.0, "An SSH keepalive every this long; a connection without an "
                    "answer for three of them is stalled and dropped.")
HELPER_START = Setting("ORCH_HELPER_START_S", "seconds", 120.0, "How long orch's helper may take to start on a host "
                       "(login shell and Python) before it is stopped as hung.")
LOG_HEARTBEAT = Setting("ORCH_LOG_HEARTBEAT_S", "seconds", 5.0, "orch logs -f: the server says it is alive this often "
                        "while a log is quiet; three missed heartbeats and the stream reconnects.")
LOST_AFTER = Setting("ORCH_LOST_AFTER_S", "seconds", 600.0, "A host whose contacts have failed for this long is lost: "
                     "its jobs show lost and orch resume --on may move them (docs/moving.md).", minimum=0.0)
CONTROLLER_CHECK = Setting("ORCH_CONTROLLER_CHECK_S", "seconds", 30.0, "How often the managed-jobs controller checks "
                          "each managed job (docs/managed.md); the controller runs with the laptop's ORCH_* settings "
                          "of orch controller up.")

# --- syncing ---------------------------------------------------------------------------------
LARGE_WORKSPACE = Setting("ORCH_LARGE_WORKSPACE_MB", "megabytes", 500, "A workspace to sync larger than this gets a "
                          "warning naming its largest files (an .orchignore is usually missing).")
LEASE_STALL = Setting("ORCH_LEASE_STALL_S", "seconds", 30.0, "A transfer into a host's workspace that makes no "
                      "progress for this long is stopped, and its lock taken over.")

# --- providers (docs/providers.md) --------------------------------------------------------------
PROVIDER_TIMEOUT = Setting("ORCH_PROVIDER_TIMEOUT_S", "seconds", 30.0, "How long one call to a provider's API may take.")
UP_TIMEOUT = Setting("ORCH_UP_TIMEOUT_S", "seconds", 600.0, "After power-on (or off), how long orch waits for the "
                     "instance to answer SSH (or to stop).")
STOCK_TRIES = Setting("ORCH_STOCK_TRIES", "count", 5, "Power-on attempts when the provider says the machine has no "
                      "free GPU right now.")
STOCK_DELAY = Setting("ORCH_STOCK_DELAY_S", "seconds", 30.0, "The first wait between those attempts; it doubles each "
                      "time, at most 300 s.")

# --- for orch's own tests -------------------------------------------------------------------------
TEST_PAUSE = Setting("ORCH_TEST_PAUSE", "text", "", "POINT:FOLDER — stop at a named step until the harness lets go "
                     "(orchestrator/testhooks.py).", for_tests=True)

ALL: tuple[Setting, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Setting))

HANDOFF = ("ORCH_HOLD_HOST", "ORCH_HOLD_VERSION", "ORCH_HOLD_WARM")  # orch -> the connection holder it starts


def check_all() -> None:
    """``SettingError`` for the first setting whose value cannot be read (before a command runs)."""
    for setting in ALL:
        setting.get()


def hold_spare_s() -> float:
    """``ORCH_HOLD_SPARE_S``, which defaults to ``ORCH_HOLD_IDLE_S``."""
    return HOLD_SPARE.seconds() if HOLD_SPARE.raw().strip() else HOLD_IDLE.seconds()


def take(name: str) -> str | None:
    """A ``HANDOFF`` variable's value, removed from this process's environment (so nothing this
    process starts inherits it); None when unset."""
    assert name in HANDOFF, name
    return os.environ.pop(name, None)

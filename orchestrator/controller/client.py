"""The laptop's side of a controller: install it on its host, start, ask, follow its log, stop.

Every call is one command on the controller's host (``ship.argv``) over the host's transport;
the code is installed on first use (``ship.code_tar``: the laptop's own orch, so the controller
runs the laptop's version; a controller of other code is replaced at ``up``). Secret values go
on the command's stdin, never in an argv; the host side hands them to the controller's memory.
Which host runs this laptop's controller is kept in ``ORCH_HOME/controller.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable

from orchestrator import settings
from orchestrator.access.connect import open_transport
from orchestrator.controller import ship
from orchestrator.errors import RemoteError, UsageError
from orchestrator.home import write_private
from orchestrator.hosts.inventory import Host, Inventory
from orchestrator.transport.base import CommandFailed, Transport, never

Say = Callable[[str], None]
RECORD = "controller.json"
NOT_FORWARDED = {"ORCH_HOME", "ORCH_TRACE", "ORCH_WARM"}


def recorded_host(home: Path) -> str | None:
    """The host this laptop's controller runs on (``orch controller up``), or None."""
    try:
        value = json.loads((home / RECORD).read_text(encoding="utf-8")).get("host")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def choose_host(home: Path, given: str | None) -> str:
    """``given``, else the recorded host; ``UsageError`` when neither names one."""
    name = given or recorded_host(home)
    if name is None:
        raise UsageError("no controller yet: start one with `orch controller up HOST` (a host that stays on, or local)")
    return name


def forwarded_settings() -> dict[str, str]:
    """The laptop's ``ORCH_*`` settings the controller runs with (none of them a secret)."""
    names = {s.name for s in settings.ALL} - NOT_FORWARDED
    return {k: v for k, v in os.environ.items() if k in names and v}


class Controller:
    """The controller on ``host`` (an inventory entry or ``local``)."""

    def __init__(self, host: Host, inventory: Inventory, say: Say) -> None:
        self.host, self.inventory, self.say = host, inventory, say
        self._transport: Transport | None = None

    def __enter__(self) -> "Controller":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            self._transport = open_transport(self.host, self.inventory, never)
        return self._transport

    def _call(self, verb: str, request: dict[str, Any] | None = None, timeout: float = 300) -> dict[str, Any]:
        """Run ``verb`` on the host (installing the code first when it is missing); its JSON reply."""
        data = json.dumps(request).encode() if request is not None else None
        result = self.transport.run(ship.argv(self.host, verb), input=data, timeout=timeout)
        if result.exit_code == ship.MISSING_EXIT:
            self.install()
            result = self.transport.run(ship.argv(self.host, verb), input=data, timeout=timeout)
        if not result.ok:
            raise CommandFailed(result, f"controller {verb}")
        try:
            value = json.loads(result.stdout.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RemoteError(f"controller {verb} on {self.host.name} answered no JSON: "
                              f"{result.stdout.decode(errors='replace')[-300:]!r}") from None
        if not isinstance(value, dict):
            raise RemoteError(f"controller {verb} on {self.host.name} answered {value!r}")
        return value

    def install(self) -> None:
        self.say(f"{self.host.name}: installing orch ({ship.code_hash()}) for the controller")
        result = self.transport.run(ship.argv(self.host, "install"), input=ship.code_tar(), timeout=300)
        if not result.ok:
            raise CommandFailed(result, "installing the controller's code")

    def check_deps(self) -> None:
        found = self._call("deps")
        missing = [str(m) for m in found.get("missing") or []]
        if missing:
            pip = {"yaml": "pyyaml"}
            raise RemoteError(f"the Python on {self.host.name} ({found.get('python')}, {found.get('python_version')}) "
                              f"lacks {', '.join(missing)}, which orch needs: install them there (python -m pip "
                              f"install --user {' '.join(pip.get(m, m) for m in missing)}) or name another Python "
                              f"with orch hosts add {self.host.name} ... --python PATH")

    def status(self) -> dict[str, Any]:
        return self._call("ask", {"op": "status"})

    def ask(self, request: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
        """A request to the running controller; ``RemoteError`` when none runs or it refused."""
        reply = self._call("ask", request, timeout)
        if reply.get("running") is False:
            raise RemoteError(f"no controller runs on {self.host.name}: start it with orch controller up "
                              f"{self.host.name}")
        if "error" in reply:
            raise RemoteError(f"the controller on {self.host.name}: {reply['error']}")
        return reply

    def up(self, names: Iterable[str]) -> dict[str, Any]:
        """Install, start (or keep) the controller, send the secrets it wants plus ``names``
        (each read from this laptop's environment; the unset ones reported, not sent)."""
        self.check_deps()
        now = self.status()
        wanted = sorted(set(names) | set((now.get("secrets") or {}).get("held", []))
                        | set((now.get("secrets") or {}).get("missing", [])))
        values = {n: os.environ[n] for n in wanted if os.environ.get(n)}
        request = {"settings": forwarded_settings(), "start_script": ship.start_script(self.host),
                   "secrets": values, "names": wanted}
        reply = self._call("up", request)
        if "error" in reply:
            log = f"\n{reply['log']}" if reply.get("log") else ""
            raise RemoteError(f"the controller on {self.host.name} did not start: {reply['error']}{log}")
        reply["unset_here"] = [n for n in wanted if n not in values]
        write_private(self.inventory.home / RECORD, json.dumps({"host": self.host.name}) + "\n")
        return reply

    def down(self) -> dict[str, Any]:
        return self._call("down")

    def pull(self, job_id: str, consume: Callable[[Any], int]) -> int:
        """The controller's copy of ``job_id`` as a tar stream (``host.py pack``) handed to
        ``consume`` (a file-like object to read); what ``consume`` returns."""
        self._call("deps")  # installs this version's code when it is missing
        proc = self.transport.start(ship.argv(self.host, "pack", job_id))
        try:
            result = consume(_Reader(proc))
            code = proc.wait()
        finally:
            proc.kill()
        if code != 0:
            raise RemoteError(f"the controller on {self.host.name} has no copy of {job_id} "
                              f"({proc.stderr.decode(errors='replace').strip()[-300:] or f'exit {code}'})")
        return result

    def follow_log(self, follow: bool, tail: int, write: Callable[[bytes], None]) -> None:
        """The log's last ``tail`` lines; ``follow``: then what it writes, until interrupted."""
        args = ["--tail", str(tail)] + (["-f"] if follow else [])
        self._call("deps")  # installs this version's code when it is missing
        proc = self.transport.start(ship.argv(self.host, "logs", *args))
        try:
            while chunk := proc.read():
                write(chunk)
            proc.wait()
        finally:
            proc.kill()


class _Reader:
    """A ``Process``'s stdout as the file object ``tarfile`` streams from."""

    def __init__(self, proc: Any) -> None:
        self.proc = proc

    def read(self, size: int = 65536) -> bytes:
        return self.proc.read(size if size and size > 0 else 65536)

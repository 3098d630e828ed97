"""The controller's commands on its host: ``main(folder, code, argv)``, run by ``ship.BOOT``.

Verbs (each prints one JSON object on stdout unless said otherwise):

- ``deps``: which of the laptop package's dependencies the host's Python lacks.
- ``up`` (stdin: ``{"settings", "start_script", "secrets", "names"}``): write ``settings.json``
  and ``start.sh``; stop a controller of other code (the laptop's version replaces it); start
  one when none runs, detached (its own session, streams to ``controller.log``: it outlives
  the SSH session); hand it the secrets; put the ``@reboot`` line in the user's crontab when
  ``crontab`` exists (``cron`` says what was done).
- ``start``: start one when none runs (``start.sh``, the crontab's line).
- ``run``: be the controller (``service.Service``), in the foreground.
- ``ask`` (stdin: a request): pass it to the controller; ``{"running": false, ...}`` when none runs.
- ``down``: stop it, wait until its lease is free, take its crontab line out.
- ``logs [--tail N] [-f]``: the log's last lines as text; ``-f``: then follow until killed.
- ``pack JOB``: the controller's copy of a managed job as a tar on stdout.

Only the standard library (and orch's own stdlib-only ``home``) is imported before ``run``: ``deps`` must answer where the
dependencies are missing.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.controller.layout import Layout
from orchestrator.controller.wire import ask
from orchestrator.home import lock_free, write_private

DEPENDENCIES = ("pydantic", "yaml", "paramiko", "click", "rich")
READY_S = 60.0
MARK = "# orch controller"


def _json(value: dict[str, Any]) -> int:
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()
    return 0


def _stdin_json() -> dict[str, Any]:
    data = sys.stdin.buffer.read()
    value = json.loads(data) if data.strip() else {}
    if not isinstance(value, dict):
        raise SystemExit("stdin: not a JSON object")
    return value


def running(layout: Layout) -> dict[str, Any] | None:
    """The running controller's status, or None when none answers on its socket."""
    try:
        return ask(layout.sock, {"op": "status"}, timeout=30)
    except (OSError, ValueError):
        return None


def lease_free(layout: Layout) -> bool:
    """True when no controller holds (or is starting with) the folder's lease."""
    return lock_free(layout.lock)


def start(layout: Layout, code: str) -> dict[str, Any]:
    """Start the controller when none runs; wait until it answers. ``{"started": bool, ...status}``;
    ``{"error": ...}`` with the log's tail when it ended instead."""
    now = running(layout)
    if now is not None:
        return {"started": False, **now}
    if not lease_free(layout):  # one is starting, or stuck before its socket: never a second one
        return {"error": f"another controller holds {layout.lock} but does not answer on {layout.sock}"}
    layout.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    boot = (f"import sys; sys.path.insert(0, {code!r}); from orchestrator.controller.host import main; "
            f"sys.exit(main({str(layout.folder)!r}, {code!r}, ['run']))")
    with open(layout.log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-c", boot], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, close_fds=True, cwd="/")
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        now = running(layout)
        if now is not None and now.get("pid") == proc.pid:
            return {"started": True, **now}
        code_now = proc.poll()
        if code_now is not None:
            now = running(layout)  # lost a race to another start: that one runs
            if now is not None:
                return {"started": False, **now}
            return {"error": f"the controller exited {code_now} as it started", "log": tail(layout, 20)}
        time.sleep(0.1)
    return {"error": f"the controller did not answer within {READY_S:g} s", "log": tail(layout, 20)}


def stop(layout: Layout, wait_s: float = 60.0) -> bool:
    """Ask the running controller to stop; True once its lease is free."""
    try:
        ask(layout.sock, {"op": "stop"}, timeout=10)
    except (OSError, ValueError):
        pass
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if lease_free(layout):
            return True
        time.sleep(0.1)
    return False


def tail(layout: Layout, lines: int) -> str:
    try:
        data = layout.log.read_bytes()[-(1 << 20):]
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def cron_line(layout: Layout) -> str:
    return "@reboot /bin/sh " + shlex.quote(str(layout.start_script))


def crontab(layout: Layout, install: bool) -> str:
    """Put (``install``) or take out the ``@reboot`` line of this controller in the user's
    crontab; what was done, in words."""
    found = shutil.which("crontab")
    if found is None:
        return "absent"
    current = subprocess.run([found, "-l"], capture_output=True, text=True)
    lines = current.stdout.splitlines() if current.returncode == 0 else []
    ours = f"{MARK} {layout.folder}"
    kept = [line for line in lines if line != ours and line != cron_line(layout)]
    if install:
        kept += [ours, cron_line(layout)]
    if kept == lines:
        return "installed" if install else "none"
    wrote = subprocess.run([found, "-"], input="".join(f"{line}\n" for line in kept), capture_output=True, text=True)
    if wrote.returncode != 0:
        return f"failed: {wrote.stderr.strip() or f'crontab exited {wrote.returncode}'}"
    return "installed" if install else "removed"


def up(layout: Layout, code: str) -> dict[str, Any]:
    request = _stdin_json()
    layout.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(layout.settings, json.dumps(request.get("settings") or {}, sort_keys=True) + "\n")
    write_private(layout.start_script, str(request.get("start_script") or ""))
    layout.start_script.chmod(0o700)
    replaced = None
    now = running(layout)
    if now is not None and now.get("code") != Path(code).name:
        replaced = now.get("code")
        if not stop(layout):
            return {"error": f"the controller of other code ({replaced}, pid {now.get('pid')}) did not stop"}
    started = start(layout, code)
    if "error" in started:
        return started
    reply = ask(layout.sock, {"op": "secrets", "values": request.get("secrets") or {},
                              "names": request.get("names") or []})
    return {**reply, "started": started["started"], "replaced": replaced, "cron": crontab(layout, True)}


def down(layout: Layout) -> dict[str, Any]:
    now = running(layout)
    stopped = stop(layout) if now is not None or not lease_free(layout) else True
    return {"was_running": now is not None, "stopped": stopped, "pid": (now or {}).get("pid"),
            "cron": crontab(layout, False)}


def logs(layout: Layout, args: list[str]) -> int:
    count = int(args[args.index("--tail") + 1]) if "--tail" in args else 200
    text = tail(layout, count)
    sys.stdout.write(text + ("\n" if text else ""))
    sys.stdout.flush()
    if "-f" not in args:
        return 0
    try:
        f = open(layout.log, "rb")
    except OSError:
        return 0
    with f:
        f.seek(0, os.SEEK_END)
        while True:
            chunk = f.read(65536)
            if chunk:
                sys.stdout.buffer.write(chunk)
                sys.stdout.flush()
            else:
                time.sleep(0.5)


def pack(layout: Layout, job_id: str) -> int:
    """The controller's copy of ``job_id`` (``home/runs/<job_id>/``, less the move kit and
    unfinished parts) as a tar on stdout; exit 1 when there is none."""
    import re
    import tarfile

    folder = layout.home / "runs" / job_id
    if not re.match(r"^[a-z0-9][a-z0-9-]*$", job_id) or not folder.is_dir():
        sys.stderr.write(f"no copy of {job_id!r} here\n")
        return 1
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            if rel.parts[0] == ".orch-job" or any(p.startswith((".part-", ".gone-")) or p.endswith(".part")
                                                  for p in rel.parts):
                continue
            if path.is_file() and not path.is_symlink():
                tar.add(path, arcname=str(rel), recursive=False)
    sys.stdout.flush()
    return 0


def run(layout: Layout, code: str) -> int:
    """Be the controller: the settings from ``up``, its own ORCH_HOME, then ``service``."""
    settings = json.loads(layout.settings.read_text()) if layout.settings.is_file() else {}
    for name, value in settings.items():
        if isinstance(name, str) and name.startswith("ORCH_") and isinstance(value, str):
            os.environ[name] = value
    os.environ["ORCH_HOME"] = str(layout.home)
    from orchestrator import settings as orch_settings
    from orchestrator.controller import jobs
    from orchestrator.controller.service import Service

    service = Service(layout, Path(code).name)
    jobs.attach(service)
    return service.serve(orch_settings.CONTROLLER_CHECK.seconds())


def main(folder: str, code: str, argv: list[str]) -> int:
    layout = Layout(Path(folder))
    verb, args = (argv[0] if argv else ""), argv[1:]
    if verb == "deps":
        missing = []
        for name in DEPENDENCIES:
            try:
                __import__(name)
            except ImportError:
                missing.append(name)
        return _json({"missing": missing, "python": sys.executable,
                      "python_version": ".".join(map(str, sys.version_info[:3]))})
    if verb == "up":
        return _json(up(layout, code))
    if verb == "start":
        return _json(start(layout, code))
    if verb == "run":
        return run(layout, code)
    if verb == "ask":
        request = _stdin_json()
        try:
            return _json(ask(layout.sock, request))
        except (OSError, ValueError):
            info = {}
            try:
                info = json.loads(layout.info.read_text())
            except (OSError, ValueError):
                pass
            return _json({"running": False, "last": info, "installed": layout.folder.is_dir(),
                          "log": tail(layout, 5)})
    if verb == "down":
        return _json(down(layout))
    if verb == "logs":
        return logs(layout, args)
    if verb == "pack":
        return pack(layout, args[0] if args else "")
    sys.stderr.write(f"unknown verb {verb!r}\n")
    return 2

"""A word on the laptop when a followed or watched job ends (opt-in: ``--notify`` or ``ORCH_NOTIFY=1``).

``ended`` rings the terminal bell (when stderr is a terminal) and shows a desktop notification
with the OS notifier where there is one: ``osascript`` on macOS, ``notify-send`` on Linux
desktops. A missing or failing notifier is silent: the bell and the command's own last line
remain. ``Transitions`` tells which jobs of a repeated status listing have just ended.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Any, TextIO

from remote_payload.contract.protocol import TERMINAL

from orchestrator import settings

NOTIFIER_TIMEOUT_S = 10


def wanted(flag: bool) -> bool:
    """``--notify``, or ``ORCH_NOTIFY`` set to 1/true/yes in the environment."""
    return flag or settings.NOTIFY.on()


def _applescript(text: str) -> str:
    """``text`` as an AppleScript string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def notifier(title: str, body: str) -> list[str] | None:
    """The OS notifier's argv for this message, or None where there is none."""
    if sys.platform == "darwin" and shutil.which("osascript"):
        return ["osascript", "-e", f"display notification {_applescript(body)} with title {_applescript(title)}"]
    if shutil.which("notify-send"):
        return ["notify-send", "--app-name=orch", title, body]
    return None


def ended(job_id: str, status: dict[str, Any], err: TextIO | None = None) -> None:
    """Tell the person at the laptop that ``job_id`` ended (bell + desktop notification)."""
    err = err or sys.stderr
    state = str(status.get("state"))
    reason = status.get("reason")
    body = (f"{state}: {reason}" if reason and state != "succeeded" else state)[:300]
    if err.isatty():
        err.write("\a")
        err.flush()
    argv = notifier(f"orch: {job_id}", body.replace("\n", " "))
    if argv is None:
        return
    try:
        subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=NOTIFIER_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        pass


class Transitions:
    """Remembers each job's last state; ``ended`` returns the jobs that were seen active
    before and are terminal now (a job first seen already ended is not news)."""

    def __init__(self) -> None:
        self.last: dict[str, str] = {}

    def ended(self, statuses: dict[str, dict[str, Any]]) -> list[str]:
        news = [job for job, st in statuses.items()
                if st.get("state") in TERMINAL and job in self.last and self.last[job] not in TERMINAL]
        self.last.update({job: str(st.get("state")) for job, st in statuses.items()})
        return news

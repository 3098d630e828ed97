"""Every string from a server reaches the terminal without control characters and is never
read as rich markup — in a pipe and on a real terminal (a pty)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

from tests.support.orch import Orch, write_job

HOSTILE = "\\x1b]0;pwned\\x07\\x1b[2J\\x1b]8;;http://evil.example\\x07link\\x1b]8;;\\x07 [/dim] [bold red]x[/]"

FAILING = f"""\
import os, pathlib
out = pathlib.Path("outputs")
out.mkdir()
(out / "ok.txt").write_text("ok")
(out / "evil\\x1b[31m[dim].bin").write_bytes(b"x")
raise ValueError("{HOSTILE}")
"""


def on_a_terminal(orch: Orch, *args: str) -> subprocess.CompletedProcess[str]:
    """Run orch under `script`, so its stdout and stderr are a terminal (rich's TTY path)."""
    command = shlex.join([sys.executable, "-m", "orchestrator", *args])
    return subprocess.run(["script", "-qefc", command, "/dev/null"], cwd=orch.cwd, capture_output=True,
                          text=True, env={**orch.env, "TERM": "xterm", "COLUMNS": "120"}, timeout=300)


def test_a_hostile_failure_reason_and_file_name_reach_the_terminal_clean(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "hostile", host, ["python", "boom.py"], extra="outputs: [outputs/]\n")
    (orch.cwd / "ws" / "boom.py").write_text(FAILING)
    piped = orch("submit", str(spec), "--follow", "--json", check=1)
    job = json.loads(piped.stdout)["job_id"]
    tty = on_a_terminal(orch, "logs", job, "-f")
    status_tty = on_a_terminal(orch, "status", job)
    fetch_tty = on_a_terminal(orch, "fetch", job, "--dest", str(orch.cwd / "elsewhere"))
    for out in (piped.stderr, piped.stdout, tty.stdout, status_tty.stdout, fetch_tty.stdout,
                orch("status", job, "--wide").stdout, orch("show", job).stdout):
        assert "\x1b]" not in out and "\x07" not in out and "\x1b[2J" not in out
        assert "MarkupError" not in out and "internal error" not in out, out[-2000:]
    assert "[/dim] [bold red]x[/]" in tty.stdout, tty.stdout[-2000:]  # shown as text, not taken as markup
    assert status_tty.returncode == 0 and fetch_tty.returncode == 0, fetch_tty.stdout
    assert "not fetched, names with control characters" in fetch_tty.stdout

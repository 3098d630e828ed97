"""jobdir/processes.py: a process is known by its pid and command line from the moment it is
started, through its end (a zombie is not alive), and a recycled pid is told apart by its start
time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from remote_payload.jobdir import processes

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)", "supervisor.py", "job-7"]


def test_a_process_is_known_by_its_command_line_the_moment_popen_returns() -> None:
    """Popen returns when the child's close-on-exec pipe closes, before the kernel has laid out
    the new program's arguments: read at once, the command line was empty in ~1 of 4 starts
    here, and the GPU queue dropped a live supervisor's place."""
    for _ in range(60):
        proc = subprocess.Popen(SLEEPER)
        try:
            assert processes.pid_alive(proc.pid, "supervisor") and processes.pid_alive(proc.pid, "job-7")
            assert not processes.pid_alive(proc.pid, "job-8")
        finally:
            proc.kill()
            proc.wait()


def test_an_ended_or_reaped_process_is_not_alive_and_a_start_time_tells_a_recycled_pid() -> None:
    proc = subprocess.Popen(SLEEPER)
    assert processes.alive([(proc.pid, 0)]) == []  # another start time: a recycled pid's record
    stat = Path(f"/proc/{proc.pid}/stat").read_bytes().rsplit(b")", 1)[-1].split()
    me = (proc.pid, int(stat[19]))
    assert processes.alive([me]) == [me]
    proc.kill()
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped: a zombie
    assert processes.pid_alive(proc.pid) and not processes.pid_alive(proc.pid, "supervisor")
    assert processes.alive([me]) == []
    proc.wait()
    assert not processes.pid_alive(proc.pid, "supervisor") and processes.alive([me]) == []

"""The warm server (orchestrator/warm/): a command it runs behaves as it would in its own
process — output, exit codes, Ctrl-C, SIGTERM, a killed client, ignored signals, a question at
the terminal — and a server never runs code or an environment other than its client's."""

from __future__ import annotations

import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.holder.wire import ask
from orchestrator.warm.server import stop_servers
from tests.support.orch import REPO, Orch, write_job
from tests.support.poll import wait_until
from tests.support.sshd import SSHServer

SLEEPY = ["python", "-c", "import time; print('up', flush=True); time.sleep(120)"]


def server_of(env: dict[str, str]) -> Path:
    """The socket of the server for a command run with ``env``, computed by orch's own code
    under that environment (its Python, its source folder), as its client computes it."""
    found = subprocess.run([sys.executable, "-c", "from orchestrator.warm import wire; print(wire.place().sock)"],
                           env=env, cwd="/", capture_output=True, text=True, check=True)
    return Path(found.stdout.strip())


def ready(env: dict[str, str]) -> int:
    """The pid of the running server for ``env``, once it listens."""
    def ping() -> int | None:
        try:
            return ask(server_of(env), "ping", timeout=2).get("pid")
        except (OSError, ValueError):
            return None
    return wait_until(ping, what="the warm server to listen", timeout=60)


def forked_by(trace: Path, before: int = 0) -> list[tuple[int, int]]:
    """(command pid, server pid) of each command a warm server ran, from the ORCH_TRACE file."""
    text = trace.read_text() if trace.exists() else ""
    return [(int(a), int(b)) for a, b in re.findall(r"orch-trace (\d+) .* warm +forked by the warm server (\d+)",
                                                    text)][before:]


def warmed(orch: Orch, tmp_path: Path) -> tuple[dict[str, str], Path]:
    """orch's environment with a trace file, and its server started and listening."""
    trace = tmp_path / "trace.txt"
    env = {**orch.env, "ORCH_TRACE": str(trace)}
    orch("status", env=env)
    ready(env)
    return env, trace


def test_a_command_after_the_first_runs_on_the_warm_server_with_the_same_output_and_exit_code(
        orch: Orch, tmp_path: Path) -> None:
    env, trace = warmed(orch, tmp_path)
    assert forked_by(trace) == []  # the first command ran in its own process and started the server
    (orch.cwd / "bad.yaml").write_text("name: x\nhosts: [local]\nlaunch:\n  nproc_per_node: two\n")
    runs = {}
    for how in ("warm", "cold"):
        extra = {} if how == "warm" else {"ORCH_WARM": "0"}
        runs[how] = [orch(*args, env={**env, **extra}, check=None) for args in
                     (("check", "bad.yaml"), ("status", "--json"), ("logs", "nosuchjob"), ("status",))]
    for warm, cold in zip(runs["warm"], runs["cold"]):
        assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr), warm.args
    assert runs["warm"][0].returncode == 2 and "bad.yaml:4" in runs["warm"][0].stderr
    server = ready(env)
    assert [s for _, s in forked_by(trace)] == [server] * 4  # the warm ones, and only those
    other_trace = tmp_path / "other-trace.txt"  # tracing elsewhere, or not at all: the same server
    orch("status", env={**env, "ORCH_TRACE": str(other_trace)})
    orch("status", env={k: v for k, v in env.items() if k != "ORCH_TRACE"})
    assert [s for _, s in forked_by(other_trace)] == [server] and ready(env) == server
    assert len(forked_by(trace)) == 4  # the untraced command wrote no trace


def test_ctrl_c_sigterm_and_a_killed_client_end_the_command_as_they_would_end_orch(
        orch: Orch, tmp_path: Path) -> None:
    env, trace = warmed(orch, tmp_path)
    job = printing_job(orch, env)
    seen = len(forked_by(trace))

    def follow() -> tuple[subprocess.Popen, int]:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "logs", job, "-f"], cwd=orch.cwd, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        command = wait_until(lambda: forked_by(trace, seen),
                             what="the follower's command to start", timeout=120)[-1][0]
        return proc, command

    proc, command = follow()
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "stopped following" in err, (out, err)
    wait_until(lambda: not alive(command), what="the interrupted command to end", timeout=30)

    seen = len(forked_by(trace))
    proc, command = follow()
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM  # as orch's own process ends at SIGTERM
    wait_until(lambda: not alive(command), what="the terminated command to end", timeout=30)

    seen = len(forked_by(trace))
    proc, command = follow()
    proc.kill()
    proc.communicate(timeout=60)
    wait_until(lambda: not alive(command), what="the killed client's command to end", timeout=30)
    orch("cancel", job, env=env)


def printing_job(orch: Orch, env: dict[str, str]) -> str:
    """A job on ``local`` that printed its first line and sleeps on (``SLEEPY``): its id."""
    job = orch.json("submit", str(write_job(orch.cwd, "sleepy", "local", SLEEPY)), env=env)["job_id"]
    wait_until(lambda: "up" in orch("logs", job, env=env).stdout, what="the job to print", timeout=120)
    return job


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_signals_ignored_where_orch_started_stay_ignored_in_its_command(orch: Orch, tmp_path: Path) -> None:
    """``nohup orch ...`` and a script's ``orch ... &``: SIGHUP (and SIGINT) stay ignored."""
    env, trace = warmed(orch, tmp_path)
    job = orch.json("submit", str(write_job(orch.cwd, "sleepy", "local", SLEEPY)), env=env)["job_id"]
    seen = len(forked_by(trace))

    def ignore() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "logs", job, "-f"], cwd=orch.cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=ignore)
    try:
        command = wait_until(lambda: forked_by(trace, seen), what="the command to start", timeout=120)[-1][0]
        masks = dict(line.split(":\t") for line in Path(f"/proc/{command}/status").read_text().splitlines()
                     if line.startswith(("SigIgn", "SigCgt")))
        assert int(masks["SigIgn"], 16) & (1 << (signal.SIGHUP - 1))  # ignored, as in the client
        assert int(masks["SigCgt"], 16) & (1 << (signal.SIGINT - 1))  # Python's KeyboardInterrupt
        proc.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert proc.poll() is None and alive(command)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    orch("cancel", job, env=env)


def test_a_server_stopped_while_a_command_runs_lets_the_next_server_start_at_once(orch: Orch, tmp_path: Path) -> None:
    """A server that stops (stale code, idle, stop) finishes its running commands; nothing of it
    — its lock least of all — keeps its successor from starting meanwhile."""
    env, trace = warmed(orch, tmp_path)
    old = ready(env)
    job = orch.json("submit", str(write_job(orch.cwd, "sleepy", "local", SLEEPY)), env=env)["job_id"]
    seen = len(forked_by(trace))
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "logs", job, "-f"], cwd=orch.cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        command = wait_until(lambda: forked_by(trace, seen), what="the follower to start", timeout=120)[-1][0]
        stop_servers(orch.home, wait_s=1)
        assert alive(old) and alive(command)  # it waits for its command, which goes on
        orch("status", env=env)
        new = ready(env)
        assert new != old
        orch("status", env=env)
        assert forked_by(trace)[-1][1] == new
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 130
    wait_until(lambda: not alive(old), what="the old server to end after its command", timeout=30)
    orch("cancel", job, env=env)


def test_a_question_is_asked_at_the_clients_terminal(orch: Orch, sshd: SSHServer, tmp_path: Path) -> None:
    """A host's first contact asks to trust its key: the command runs on the server, away from
    the terminal, and the client asks at its terminal and hands the answer over."""
    env, trace = warmed(orch, tmp_path)
    orch("hosts", "add", "box", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root), "--python", sys.executable, env=env)
    spec = write_job(orch.cwd, "hi", "box", ["python", "-c", "print('hi')"])
    pid, fd = pty.fork()
    if pid == 0:  # the client, in a terminal of its own (session leader, foreground)
        os.chdir(orch.cwd)
        os.execve(sys.executable, [sys.executable, "-m", "orchestrator", "submit", str(spec), "--follow"], env)
    said = b""
    try:
        said = read_until(fd, b"Trust it and pin it? [y/N]: ")
        os.write(fd, b"y\n")
        said += read_until(fd, b"job succeeded")
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, said
    assert forked_by(trace)  # the submit ran on the warm server
    assert "host_key" in (orch.home / "hosts" / "box.json").read_text() or "box" in orch("hosts", "list").stdout


def read_until(fd: int, marker: bytes, timeout: float = 120) -> bytes:
    got = b""
    deadline = time.monotonic() + timeout
    while marker not in got:
        assert time.monotonic() < deadline, got.decode(errors="replace")
        if select.select([fd], [], [], 1)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            got += chunk
    assert marker in got, got.decode(errors="replace")
    return got


def test_a_server_runs_only_its_own_code_and_environment_and_idles_out(orch: Orch, tmp_path: Path) -> None:
    """Another environment gets a server of its own; a changed source file makes the server
    step aside (the command runs in its own process) and the next command gets a fresh one;
    an idle server ends."""
    src = tmp_path / "src"
    for package in ("orchestrator", "remote_payload"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    trace = tmp_path / "trace.txt"
    env = {**orch.env, "PYTHONPATH": str(src), "ORCH_TRACE": str(trace), "ORCH_WARM_IDLE_S": "60"}
    orch("status", env=env)
    first = ready(env)
    other = {**env, "ORCH_CONNECT_TIMEOUT_S": "7"}
    orch("status", env=other)
    second = ready(other)
    assert first != second and server_of(env) != server_of(other)
    orch("status", env=env)
    assert forked_by(trace)[-1][1] == first

    (src / "orchestrator" / "cli" / "status.py").touch()
    before = len(forked_by(trace))
    assert orch("status", env=env).stdout == orch("status", env={**env, "ORCH_WARM": "0"}).stdout
    assert len(forked_by(trace)) == before  # the stale server ran nothing
    wait_until(lambda: not alive(first), what="the stale server to end", timeout=60)
    fresh = ready(env)
    assert fresh != first
    orch("status", env=env)
    assert forked_by(trace)[-1][1] == fresh

    stop_servers(orch.home)
    assert not alive(fresh) and not alive(second)
    quick = {**env, "ORCH_WARM_IDLE_S": "1"}
    orch("status", env=quick)
    idle = ready(quick)
    wait_until(lambda: not alive(idle), what="the idle server to end", timeout=60)
    assert not server_of(quick).exists()

"""The connection holder (docs/connections.md) against the real loopback sshd.

The observable that a command went through a holder: ``$SSH_CONNECTION`` on the server names
the client's TCP port, so commands sharing one held connection print the same line, and a
direct connection prints another. Every wait is on a condition with a generous bound.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from orchestrator.access.connect import open_transport
from orchestrator.errors import HostError
from orchestrator.holder import spawn
from orchestrator.holder.client import HeldTransport
from orchestrator.holder.commands import SPARES_PER_ARGV
from orchestrator.holder.spawn import running, stop_holders
from orchestrator.holder.wire import Reader
from orchestrator.hosts.inventory import Host
from tests.support.orch import Orch
from tests.support.poll import wait_until
from tests.support.sshd import SSHServer, ensure_user, keygen, start_sshd

SHOW = "echo $SSH_CONNECTION"


def gone(pid: int) -> bool:
    """The process ended (a zombie nobody reaped yet counts as ended)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def holder(home: Path, not_pid: int | None = None) -> tuple[Path, dict[str, Any]]:
    """The one live holder of ``home`` (other than ``not_pid``), once it answers."""
    def found() -> tuple[Path, dict[str, Any]] | None:
        live = [(s, i) for s, i in running(home) if i["pid"] != not_pid and i["active"]]
        return live[0] if live else None
    return wait_until(found, what="a connection holder to answer", timeout=90)


def holder_pids(home: Path) -> list[int]:
    """Every holder process of ``home`` (from its environment: ORCH_HOME and ORCH_HOLD_VERSION
    are set only in a holder's), running or not yet listening."""
    out = []
    for pid in subprocess.run(["pgrep", "-f", "orchestrator.holder.daemon"], capture_output=True, text=True).stdout.split():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"ORCH_HOME={home.resolve()}".encode() in env and any(v.startswith(b"ORCH_HOLD_VERSION=") for v in env) \
                and not gone(int(pid)):
            out.append(int(pid))
    return out


def seen(orch: Orch, host: str = "box", env: dict[str, str] | None = None) -> str:
    return orch("exec", host, "--", SHOW, env=env).stdout.strip()


def test_later_commands_share_the_held_connection_in_a_private_folder(orch: Orch, box: str) -> None:
    first = seen(orch)  # direct; starts a holder
    sock, info = holder(orch.home)
    second, third = seen(orch), seen(orch)
    assert second == third != first
    assert holder(orch.home)[1]["served"] >= info["served"] + 2
    assert sock.parent == orch.home / "holders"
    assert stat.S_IMODE(os.lstat(sock.parent).st_mode) == 0o700
    assert stat.S_ISSOCK(os.lstat(sock).st_mode) and stat.S_IMODE(os.lstat(sock).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(sock.with_suffix(".log")).st_mode) == 0o600
    pid = info["pid"]  # detached: a session of its own, no terminal, nothing inherited on 0-2
    assert os.getsid(pid) == pid and [os.readlink(f"/proc/{pid}/fd/{n}") for n in range(3)] == ["/dev/null"] * 3
    assert "closed 1 kept connection" in orch("hosts", "disconnect", "box").stderr
    wait_until(lambda: gone(info["pid"]) and not sock.exists(), what="the holder to stop", timeout=90)


def test_an_idle_holder_exits_and_removes_its_socket(orch: Orch, box: str) -> None:
    seen(orch, env={"ORCH_HOLD_IDLE_S": "2"})
    logs = orch.home / "holders"
    wait_until(lambda: logs.is_dir() and any("stopping: idle for 2 s" in p.read_text() for p in logs.glob("*.log")),
               what="the holder to stop when idle", timeout=90)
    wait_until(lambda: holder_pids(orch.home) == [], what="the idle holder to exit", timeout=90)
    assert list(logs.glob("*.sock")) == [] and running(orch.home) == []


def test_a_killed_holders_socket_is_replaced_and_commands_still_work(orch: Orch, box: str) -> None:
    seen(orch)
    sock, info = holder(orch.home)
    held_line = seen(orch)
    os.kill(info["pid"], signal.SIGKILL)
    wait_until(lambda: gone(info["pid"]), what="the holder to die", timeout=90)
    assert stat.S_ISSOCK(os.lstat(sock).st_mode)  # left behind
    direct = seen(orch)  # refused socket: connects directly and starts a new holder
    assert direct != held_line
    new_sock, _ = holder(orch.home, not_pid=info["pid"])  # a new holder answers on the same path
    assert new_sock == sock
    assert seen(orch) not in (held_line, direct)


@pytest.mark.parametrize("spoil", ["group-writable", "foreign-owner"])
def test_a_folder_others_could_reach_is_refused_and_commands_connect_directly(
        orch: Orch, box: str, spoil: str) -> None:
    folder = orch.home / "holders"
    folder.mkdir(mode=0o700)
    if spoil == "group-writable":
        folder.chmod(0o770)
    else:
        os.chown(folder, 65534, 65534)
    lines = {seen(orch) for _ in range(3)}
    assert len(lines) == 3  # three connections: none held
    assert list(folder.iterdir()) == [] and holder_pids(orch.home) == []
    assert (stat.S_IMODE(folder.stat().st_mode), folder.stat().st_uid) == \
        ((0o770, 0) if spoil == "group-writable" else (0o700, 65534))  # left as it was


def test_two_clis_at_once_start_one_holder_and_share_it(orch: Orch, box: str) -> None:
    def start() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "orchestrator", "exec", box, "--", SHOW + "; sleep 1"],
                                cwd=orch.cwd, env=orch.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    racers = [start() for _ in range(3)]  # no holder yet: each may try to start one
    assert all(p.wait(timeout=120) == 0 for p in racers), [p.stderr.read() for p in racers]
    sock, info = holder(orch.home)
    wait_until(lambda: holder_pids(orch.home) == [info["pid"]], what="the losing holders to exit", timeout=90)
    pair = [start(), start()]
    outs = [p.communicate(timeout=120) for p in pair]
    assert [p.returncode for p in pair] == [0, 0], outs
    assert outs[0][0] == outs[1][0] == seen(orch) + "\n"
    assert holder(orch.home)[1]["pid"] == info["pid"]


def test_a_password_host_is_held_only_for_the_same_password(orch: Orch, sshd: SSHServer) -> None:
    ensure_user("orchhold", "hold-pw-5")
    good, bad = {"HOLD_PW": "hold-pw-5"}, {"HOLD_PW": "not-the-pw"}
    orch("hosts", "add", "pw", "--ssh", f"ssh -p {sshd.port} orchhold@127.0.0.1", "--password-env", "HOLD_PW",
         "--python", "/usr/bin/python3", "--trust", env=good)
    first = seen(orch, "pw", good)
    holder(orch.home)
    assert seen(orch, "pw", good) == seen(orch, "pw", good) != first
    wrong = orch("exec", "pw", "--", SHOW, env=bad, check=3)
    assert "authentication failed" in wrong.stderr and "not-the-pw" not in wrong.stderr
    unset = orch("exec", "pw", "--", SHOW, check=2)
    assert "$HOLD_PW is not set" in unset.stderr
    for path in (orch.home / "holders").iterdir():
        if path.is_file():
            assert b"hold-pw-5" not in path.read_bytes()


def test_a_changed_pinned_key_is_never_served_by_the_holder(orch: Orch, box: str, tmp_path: Path) -> None:
    seen(orch)
    _, info = holder(orch.home)
    other = keygen(tmp_path / "other_ed25519").split()[:2]
    entry = orch.home / "hosts" / "box.json"
    entry.write_text(json.dumps(dict(json.loads(entry.read_text()), host_key=" ".join(other))))
    out = orch("exec", box, "--", SHOW, check=3)
    assert "DIFFERENT host key" in out.stderr
    assert [i["pid"] for _, i in running(orch.home)] == [info["pid"]]  # still there, not used


def test_hold_0_and_a_disconnected_holder_connect_directly(orch: Orch, box: str) -> None:
    off = {"ORCH_HOLD": "0"}
    assert len({seen(orch, env=off) for _ in range(2)}) == 2
    assert not (orch.home / "holders").exists() and holder_pids(orch.home) == []
    seen(orch)
    _, info = holder(orch.home)
    held_line = seen(orch)
    assert seen(orch, env=off) != held_line
    assert "closed 1 kept connection" in orch("hosts", "disconnect").stderr
    wait_until(lambda: gone(info["pid"]), what="the holder to stop", timeout=90)
    assert seen(orch) != held_line


@pytest.fixture
def held_host(sshd: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    """In-process: ``box`` with a holder already running under this test's ORCH_HOME."""
    home = tmp_path / "home"
    monkeypatch.setenv("ORCH_HOME", str(home))
    host = Host(name="box", address="127.0.0.1", port=sshd.port, user="root", identity_file=str(sshd.client_key),
                root=str(tmp_path / "remote"), python=sys.executable, host_key=sshd.host_key_line)
    with open_transport(host, None, lambda fp: False) as transport:
        assert not isinstance(transport, HeldTransport)
        assert transport.run(["true"]).ok
    holder(home)
    yield host
    stop_holders(home)


def test_a_long_orch_home_puts_the_socket_in_the_private_temp_folder(
        sshd: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / ("long-" + "x" * 90)
    monkeypatch.setenv("ORCH_HOME", str(home))
    host = Host(name="box", address="127.0.0.1", port=sshd.port, user="root", identity_file=str(sshd.client_key),
                root=str(tmp_path / "remote"), python=sys.executable, host_key=sshd.host_key_line)
    sock = None
    try:
        with open_transport(host, None, lambda fp: False) as transport:
            assert not isinstance(transport, HeldTransport) and transport.run(["true"]).ok
        sock, _ = holder(home)
        assert sock.parent == Path(tempfile.gettempdir()) / f"orch-{os.getuid()}"
        assert stat.S_IMODE(os.lstat(sock.parent).st_mode) == 0o700 and len(os.fsencode(sock)) <= 100
        with open_transport(host, None, lambda fp: False) as transport:
            assert isinstance(transport, HeldTransport) and transport.run(["echo", "ok"]).stdout == b"ok\n"
    finally:
        stop_holders(home)
        for leftover in [sock.with_suffix(".log"), sock.with_suffix(".lock")] if sock else []:
            leftover.unlink(missing_ok=True)  # the shared temp folder: leave nothing of this test


def read_until(proc: Any, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = proc.read()
        assert chunk, data[-200:]
        data += chunk
    return data


def test_a_warm_spare_is_handed_out_with_its_early_output_intact(held_host: Host, tmp_path: Path) -> None:
    marks = tmp_path / "started"
    marks.mkdir()
    early = 200_000  # more than a pipe or a socket buffer holds before anyone reads
    argv = ["sh", "-c", f"touch {marks}/$$; head -c {early} /dev/zero | tr '\\0' x; echo \" ready $$\"; exec cat"]
    kept = SPARES_PER_ARGV

    def started() -> set[str]:
        return {p.name for p in marks.iterdir()}

    with open_transport(held_host, None, lambda fp: False) as transport:
        assert isinstance(transport, HeldTransport)
        first = transport.start(argv, warm=True)
        out = read_until(first, b"\n")
        pid1 = out.split()[-1].decode()
        first.write(b"one\n")
        assert read_until(first, b"one\n").endswith(b"one\n")
        first.close_stdin()
        assert first.read() == b"" and first.wait() == 0
        spares = wait_until(lambda: len(now := started() - {pid1}) == kept and now,
                            what="the spares to start, one after the other", timeout=90)
        second = transport.start(argv, warm=True)
        out = read_until(second, b"\n")
        pid2 = out.split()[-1].decode()
        assert out == b"x" * early + f" ready {pid2}\n".encode() and pid2 in spares
        second.write(b"two\n")
        assert read_until(second, b"two\n") == b"two\n"
        time.sleep(1)  # others are kept: this one's replacement waits for the command to end
        assert len(started()) == 1 + kept
        second.close_stdin()
        assert second.wait() == 0
        wait_until(lambda: len(started()) == 2 + kept, what="the next spare to start", timeout=90)
        time.sleep(1)
        assert len(started()) == 2 + kept  # that many kept, no more
        third = transport.start(argv, warm=True)
        assert read_until(third, b"\n").split()[-1].decode() in spares - {pid2}  # the oldest kept
        held = [transport.start(argv, warm=True) for _ in range(kept - 1)]  # the last one kept taken:
        for proc in held:
            read_until(proc, b"\n")
        wait_until(lambda: len(started()) > 2 + kept, what="a new spare, started while they all run", timeout=90)
        for proc in [third, *held]:
            proc.kill()
        before = started()
        cold = transport.start(argv)  # not warm: never a spare
        assert read_until(cold, b"\n").split()[-1].decode() not in before
        cold.kill()


def test_a_command_through_the_holder_times_out_or_breaks_off_loudly(held_host: Host) -> None:
    with open_transport(held_host, None, lambda fp: False) as transport:
        assert isinstance(transport, HeldTransport)
        proc = transport.start(["sh", "-c", "echo started; sleep 60"])
        assert proc.read() == b"started\n"
        proc.settimeout(0.2)
        with pytest.raises(socket.timeout):
            proc.read()
        _, info = holder(Path(os.environ["ORCH_HOME"]))
        os.kill(info["pid"], signal.SIGKILL)
        proc.settimeout(None)
        with pytest.raises(HostError, match=r"was lost.*\(through the connection holder\)"):
            proc.read()
        with pytest.raises(HostError, match="through the connection holder"):
            proc.wait()
        result = transport.run(["sh", "-c", "echo after; exit 3"])  # the holder is gone: direct
        assert (result.exit_code, result.stdout) == (3, b"after\n")


def test_a_start_finds_the_holder_stopped_and_connects_directly(held_host: Host) -> None:
    with open_transport(held_host, None, lambda fp: False) as transport:
        assert isinstance(transport, HeldTransport)
        assert transport.run(["echo", "held"]).stdout == b"held\n"
        assert stop_holders(Path(os.environ["ORCH_HOME"])) == 1
        result = transport.run(["sh", "-c", "cat; echo err >&2"], input=b"in")
        assert (result.exit_code, result.stdout, result.stderr) == (0, b"in", b"err\n")


def descendants(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out] + [d for p in out for d in descendants(int(p))]


@pytest.mark.root  # its own sshd
def test_the_holder_exits_when_the_server_goes_away(orch: Orch, tmp_path: Path) -> None:
    server = start_sshd(tmp_path / "own-sshd")
    try:
        orch("hosts", "add", "solo", "--ssh", f"ssh -p {server.port} root@127.0.0.1", "--identity",
             str(server.client_key), "--root", str(orch.remote_root), "--python", sys.executable, "--trust")
        seen(orch, "solo")
        sock, info = holder(orch.home)
        sessions = descendants(server.proc.pid)
        assert sessions  # the holder's connection
    finally:
        server.stop()
    for pid in sessions:  # stopping the listener leaves its connections; the server is gone with them
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    wait_until(lambda: gone(info["pid"]) and not sock.exists(), what="the holder to exit", timeout=90)
    assert "stopping: the SSH connection ended" in sock.with_suffix(".log").read_text()
    assert "cannot reach solo" in orch("exec", "solo", "--", "true", check=3).stderr


def test_garbled_clients_are_dropped_and_the_holder_keeps_serving(held_host: Host) -> None:
    sock, _ = holder(Path(os.environ["ORCH_HOME"]))
    for junk in (b"[1, 2]\n", b'{"argv": "sh"}\n', b'{"argv": []}\n', b"\xff\xfe not json\n", b"x" * 70000):
        with socket.socket(socket.AF_UNIX) as client:
            client.settimeout(30)
            client.connect(str(sock))
            client.sendall(junk)
            client.shutdown(socket.SHUT_WR)
            assert client.recv(100) == b""  # closed without an answer
    with socket.socket(socket.AF_UNIX) as client:  # a started command, then a frame over the limit
        client.settimeout(30)
        client.connect(str(sock))
        client.sendall(json.dumps({"argv": ["sleep", "60"]}).encode() + b"\n")
        started = Reader(client).frame()  # S, with what the holder did for it (ORCH_TRACE shows it)
        assert started is not None and started[0] == b"S"
        assert json.loads(started[1])["spare"] is False and "open_ms" in json.loads(started[1])
        client.sendall(b"I" + (1 << 30).to_bytes(4, "big"))
        data = b""
        while chunk := client.recv(4096):
            data += chunk
        assert data.startswith(b"L")  # the command was stopped, the client told
    with open_transport(held_host, None, lambda fp: False) as transport:
        assert isinstance(transport, HeldTransport)
        assert transport.run(["echo", "still here"]).stdout == b"still here\n"


def test_a_holder_imports_the_orch_that_started_it() -> None:
    assert (spawn.ORCH_SOURCE / "orchestrator" / "holder" / "spawn.py").samefile(spawn.__file__)


def test_a_holder_keeps_a_spare_of_its_spawners_helper_from_its_start(
        sshd: SSHServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("ORCH_HOME", str(home))
    host = Host(name="box", address="127.0.0.1", port=sshd.port, user="root", identity_file=str(sshd.client_key),
                root=str(tmp_path / "remote"), python=sys.executable, host_key=sshd.host_key_line)
    marks = tmp_path / "started"
    marks.mkdir()
    argv = ["sh", "-c", f"touch {marks}/$$; echo ready $$; exec cat"]
    try:
        with open_transport(host, None, lambda fp: False, warm=argv) as transport:  # direct: spawns the holder
            assert not isinstance(transport, HeldTransport) and transport.run(["true"]).ok
        holder(home)
        # Both spares (SPARES_PER_ARGV): they start one after the other, but the second's shell
        # may run before the first's, so "the first mark" need not be the first spare.
        spares = wait_until(lambda: len(names := {p.name for p in marks.iterdir()}) >= SPARES_PER_ARGV and names,
                            what="the holder's spares to start", timeout=90)
        with open_transport(host, None, lambda fp: False) as transport:  # nobody asked for it before: it is there
            assert isinstance(transport, HeldTransport)
            proc = transport.start(argv, warm=True)
            out = read_until(proc, b"\n").decode()
            assert out.startswith("ready ") and out.split()[1] in spares
            proc.close_stdin()
            assert proc.wait() == 0
    finally:
        stop_holders(home)

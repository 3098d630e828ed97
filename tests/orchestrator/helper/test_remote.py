"""The laptop <-> server protocol (``remote_payload/contract/protocol.py``): one helper session serves
every request of a command, against the loopback sshd and the local host; arguments are
checked before they leave; a malformed or garbled reply is a clear error naming the host and
the request, never a traceback; a chatty login profile is skipped."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any, Sequence

import pytest

from orchestrator.errors import RemoteError
from orchestrator.helper.remote import Remote
from orchestrator.hosts.inventory import Host
from orchestrator.transport.base import CommandFailed, Process, Transport
from orchestrator.transport.local import LocalTransport
from remote_payload.contract import protocol
from remote_payload.contract.protocol import ProtocolError, frame
from remote_payload.helper import serve


class Counting(Transport):
    """A real transport that counts the processes it starts."""

    def __init__(self, inner: Transport) -> None:
        self.inner, self.name, self.started = inner, inner.name, []

    def start(self, argv: Sequence[str], *, warm: bool = False) -> Process:
        self.started.append(list(argv))
        return self.inner.start(argv, warm=warm)

    def close(self) -> None:
        self.inner.close()


def test_one_session_serves_every_request_of_a_command(remote: Remote) -> None:
    remote.call("hello")  # installs the payload on this fresh root (a helper start that exits 97, then one more)
    counting = Counting(remote.transport)
    r = Remote(remote.host, counting)
    hello = r.call("hello")
    assert hello["root"] and r.call("status", jobs=["nojob"])["jobs"]["nojob"]["state"] == "unknown"
    assert r.call("free_port")["port"] > 0
    serving = [argv for argv in counting.started if argv[-1].endswith("serve")]
    assert len(serving) == 1, counting.started
    if remote.host.kind != "local":
        assert serving[0][:2] == ["bash", "-lc"]  # the login environment, paid once
    r.close()


def test_a_busy_session_gets_a_second_one_and_both_return(remote: Remote, tmp_path: Path) -> None:
    remote.call("hello")
    counting = Counting(remote.transport)
    r = Remote(remote.host, counting)
    listener = r.start("listen", port=int(r.call("free_port")["port"]), seconds=30)
    assert json.loads(listener.read(4096))["ready"] is True
    assert r.call("tcp_check", host="127.0.0.1", port=1)["ok"] is False  # while the listener holds a session
    listener.close_stdin()
    assert r.finish(listener) == {"ok": True}
    r.call("hello")
    assert len([a for a in counting.started if a[-1].endswith("serve")]) == 2
    r.close()


def test_a_refused_request_leaves_the_session_usable(remote: Remote) -> None:
    with pytest.raises(RemoteError, match="bad job id"):
        remote.call("cancel", job="../etc", grace=1)
    assert remote.call("hello")["python"]


def test_arguments_are_checked_before_they_leave() -> None:
    with pytest.raises(ProtocolError, match="unknown argument colour"):
        protocol.check_args("status", {"jobs": [], "colour": 1})
    with pytest.raises(ProtocolError, match="argument grace must be int or float"):
        protocol.check_args("cancel", {"job": "x", "grace": "soon"})
    with pytest.raises(ProtocolError, match="missing argument job"):
        protocol.check_args("manifest", {})
    with pytest.raises(ProtocolError, match="argument gpus must be bool"):
        protocol.check_args("hello", {"gpus": 1})
    assert protocol.check_args("hello", {}) == {"project": None, "gpus": False, "known": None, "slurm": None,
                                                "stage": None}


def test_every_request_has_one_handler_and_states_are_defined_once() -> None:
    assert set(serve.HANDLERS) == set(protocol.REQUESTS)
    from orchestrator.jobs import nodes as jobs
    from remote_payload.jobdir import status as jobstate

    assert jobs.TERMINAL is protocol.TERMINAL and set(jobstate.STATES) < set(protocol.STATES)


def _served(*requests: bytes) -> list[tuple[bytes, Any]]:
    out = io.BytesIO()
    code = serve.serve("/nonexistent-root", "/nonexistent", io.BytesIO(b"".join(requests)), out)
    data = io.BytesIO(out.getvalue())
    assert data.read(len(protocol.MAGIC)) == protocol.MAGIC
    frames = []
    while (got := protocol.read_frame(data)) is not None:
        frames.append((got[0], json.loads(got[1])))
    return [(b"exit", code)] + frames


def test_the_server_answers_a_bad_request_and_goes_on() -> None:
    q = lambda op, args: frame(b"Q", json.dumps({"op": op, "args": args}).encode())  # noqa: E731
    got = _served(q("status", {"jobs": "x"}), q("launch_rockets", {}), q("free_port", {}))
    assert got[0] == (b"exit", 0)
    assert "argument jobs must be list" in got[1][1]["error"] and "unknown request" in got[2][1]["error"]
    assert got[3][1]["port"] > 0


def test_a_broken_frame_ends_the_session() -> None:
    assert _served(b"Z\x00\x00\x00\x01x")[0] == (b"exit", 5)


def _fake_helper(tmp_path: Path, body: str) -> Remote:
    """A real process on the local host that speaks (or garbles) the protocol as ``body`` says."""
    script = tmp_path / "helper.py"
    script.write_text("import json, struct, sys\nMAGIC = %r\nout = sys.stdout.buffer\n" % protocol.MAGIC
                      + "def frame(k, p): out.write(k + struct.pack('>I', len(p)) + p); out.flush()\n" + body)
    host = Host(name="box", kind="local", root=str(tmp_path / "root"))
    remote = Remote(host, LocalTransport("box"))
    remote.argv = lambda command="serve": [sys.executable, str(script)]  # type: ignore[method-assign]
    return remote


def test_a_malformed_reply_names_the_host_and_the_request(tmp_path: Path) -> None:
    remote = _fake_helper(tmp_path, "out.write(MAGIC); sys.stdin.buffer.read(5)\n"
                                    "frame(b'R', json.dumps({'jobs': 'everything is fine'}).encode())\n")
    with pytest.raises(RemoteError, match=r"box: orch's helper answered status with a malformed reply: .*'jobs'"):
        remote.call("status", jobs=["a"])


def test_an_unknown_state_in_a_reply_is_rejected(tmp_path: Path) -> None:
    remote = _fake_helper(tmp_path, "out.write(MAGIC); sys.stdin.buffer.read(5)\n"
                                    "frame(b'R', json.dumps({'jobs': {'a': {'state': 'exploded'}}}).encode())\n")
    with pytest.raises(RemoteError, match="status of a: unknown state 'exploded'"):
        remote.call("status", jobs=["a"])


def test_a_garbled_frame_and_a_dying_helper_are_clear_errors(tmp_path: Path) -> None:
    garbled = _fake_helper(tmp_path, "out.write(MAGIC + b'\\xff' * 9); out.flush(); sys.stdin.buffer.read()\n")
    with pytest.raises(RemoteError, match="box: orch's helper answered hello with a malformed reply: garbled frame"):
        garbled.call("hello")
    dying = _fake_helper(tmp_path, "out.write(MAGIC); out.flush(); sys.stderr.write('boom\\n'); sys.exit(3)\n")
    with pytest.raises(CommandFailed, match=r"(?s)orch's helper \(during hello\) failed on box \(exit 3\).*boom"):
        dying.call("hello")


def test_a_helper_that_stopped_reading_is_its_own_error_not_a_broken_pipe(tmp_path: Path) -> None:
    closed = _fake_helper(tmp_path, "import os, time\nsys.stderr.write('boom\\n'); sys.stderr.flush(); os.close(0)\n"
                                    "out.write(MAGIC); out.flush(); time.sleep(0.5); sys.exit(3)\n")
    with pytest.raises(CommandFailed, match=r"(?s)orch's helper \(during hello\) failed on box .*boom"):
        closed.call("hello")  # the request's write meets a closed pipe every time: never a bare BrokenPipeError


def test_a_chatty_login_profile_is_skipped(tmp_path: Path) -> None:
    remote = _fake_helper(tmp_path, "print('Welcome to your GPU box!', flush=True)\nout.write(MAGIC); "
                                    "sys.stdin.buffer.read(5)\nframe(b'R', json.dumps({'port': 5, 'hostname': 'h'}).encode())\n")
    assert remote.call("free_port") == {"port": 5, "hostname": "h"}


def test_a_helper_that_never_answers_times_out_naming_the_request(tmp_path: Path) -> None:
    remote = _fake_helper(tmp_path, "out.write(MAGIC); out.flush(); import time; time.sleep(600)\n")
    with pytest.raises(RemoteError, match="box: free_port did not answer within 1 s"):
        remote.call("free_port", timeout=1)


def test_a_status_json_with_fields_of_the_wrong_type_breaks_nothing(remote: Remote) -> None:
    """The server drops a status field of the wrong type (protocol.JOB_STATUS), so the reply
    stays well-formed: the other job on the host is reported as ever."""
    jobs = Path(remote.host.root) / "jobs"
    for job, status in (("odd", {"state": "succeeded", "reason": 5, "exit_code": "zero", "node_rank": [1]}),
                        ("fine", {"state": "failed", "reason": "exit 1", "exit_code": 1})):
        (jobs / job).mkdir(parents=True)
        (jobs / job / "status.json").write_text(json.dumps(status))
    got = remote.call("status", jobs=["odd", "fine"])["jobs"]
    assert got["odd"]["state"] == "succeeded" and not {"reason", "exit_code", "node_rank"} & set(got["odd"])
    assert got["fine"] == {"state": "failed", "reason": "exit 1", "exit_code": 1, "job_id": "fine"}


def test_a_login_shell_that_never_starts_the_helper_is_named_not_waited_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_HELPER_START_S", "1")
    hanging = _fake_helper(tmp_path, "import time; time.sleep(600)\n")  # a profile stuck before the helper
    with pytest.raises(RemoteError, match=r"box: orch's helper did not start within 1 s: the login shell"):
        hanging.call("hello")

"""The server side of a session: read requests (``contract/protocol.py``), run each one's handler,
write its reply; until stdin ends.

Every handler is ``(ctx, args, inp, out) -> reply``: ``args`` already checked against the
request's row, ``inp`` the request's input stream (``reads``), ``out`` its output stream
(``writes``). A user-facing failure (``AgentError``, a refused sync, a busy lease, an OSError)
becomes that request's ``{"error": ...}`` reply and the session goes on; a broken frame ends
the session (the laptop sees the channel close).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import threading
import time
from typing import IO, Any, Callable, Dict, Optional

from remote_payload.contract import protocol
from remote_payload.contract.bytequeue import ByteQueue
from remote_payload.contract.protocol import DATA, END, REPLY, REQUEST, ProtocolError, frame, read_frame
from remote_payload.gpuqueue import queue as gpuqueue
from remote_payload.helper import netcheck, reclaim, stage, streams, workspace
from remote_payload.helper.agent import Agent, AgentError
from remote_payload.jobdir import lease, private, testclock
from remote_payload.jobdir import record as repro
from remote_payload.move import job as movejob
from remote_payload.move import pull as movepull
from remote_payload.supervisor import onfinish

LOCK_WAIT_S = 300.0  # cancel holds the jobs lock for its grace period (at most a few minutes)
Handler = Callable[[Agent, Dict[str, Any], "Input", "Output"], Dict[str, Any]]


class Input:
    """The request's byte stream: ``D`` frames up to the ``E`` frame, read like a file."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream, self.buf, self.ended = stream, ByteQueue(), False

    def read(self, n: int = -1) -> bytes:
        """``n`` bytes (all when ``n`` < 0), fewer only at the stream's end."""
        while not self.ended and (n < 0 or len(self.buf) < n):
            self._frame()
        return self.buf.take(n)

    def read1(self, n: int) -> bytes:
        """1 to ``n`` bytes as they arrived (from one frame, uncopied where it can), ``b""``
        only at the stream's end: for readers that take short reads (a file's data)."""
        while not self.ended and not self.buf:
            self._frame()
        return self.buf.take_some(n)

    def _frame(self) -> None:
        got = read_frame(self.stream)
        if got is None:
            raise ProtocolError("the laptop's stream ended without its end frame")
        kind, payload = got
        if kind == END:
            self.ended = True
        elif kind == DATA:
            self.buf.put(payload)
        else:
            raise ProtocolError("a %r frame inside a stream" % kind)

    def drain(self) -> None:
        while not self.ended:
            self.read(1 << 20)


class Output:
    """The request's byte stream to the laptop: each write one ``D`` frame."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream

    def write(self, data: bytes) -> int:
        for start in range(0, len(data), 1 << 20):
            self.stream.write(frame(DATA, data[start:start + (1 << 20)]))
        return len(data)

    def flush(self) -> None:
        self.stream.flush()


def _hello(agent: Agent, a: Dict[str, Any], inp: Input, out: Output) -> Dict[str, Any]:
    reply = agent.hello(a["project"], a["gpus"], a["known"], a["slurm"])
    if a["stage"] is not None and a["project"]:  # a resubmit that changed nothing: its code set apart now
        reply["sync"]["staged"] = stage.from_record(agent.root, a["project"], a["stage"])
    return reply


def _receive(agent: Agent, a: Dict[str, Any], inp: Input, out: Output) -> Dict[str, Any]:
    def report(kept: Dict[str, Any]) -> None:  # what is kept so far, for the laptop to say when it is interrupted
        try:
            out.write((json.dumps(kept) + "\n").encode("utf-8"))
            out.flush()
        except (OSError, ValueError):
            pass  # the laptop is gone: the receive goes on to keep what arrived

    return workspace.receive(agent.root, a["project"], inp, float(a["stall_s"]), report,
                             stage.finisher(agent.root, workspace.workspace_dir(agent.root, a["project"])))


def _follow(agent: Agent, a: Dict[str, Any], inp: Input, out: Output) -> Dict[str, Any]:
    job = a["job"]

    def finished() -> bool:
        return agent.probe(job)["state"] in protocol.SETTLED

    streams.follow(agent.log_path(job, a["node"]), a["offset"], out, finished, a["follow"], float(a["heartbeat"]))
    return {}


def _listen(agent: Agent, a: Dict[str, Any], inp: Input, out: Output) -> Dict[str, Any]:
    """A listener on ``port`` until the laptop ends the input or ``seconds`` pass; its first
    output line says whether it is bound."""
    try:
        server = netcheck.bind(a["port"])
    except OSError as exc:
        raise AgentError("cannot listen on port %d: %s" % (a["port"], exc))
    out.write((json.dumps({"ready": True, "port": a["port"]}) + "\n").encode())
    out.flush()
    stop = threading.Event()
    accepting = threading.Thread(target=netcheck.accept_until, args=(server, stop, time.time() + a["seconds"]),
                                 daemon=True)
    accepting.start()
    inp.drain()
    stop.set()
    accepting.join()
    return {"ok": True}


def _launch(agent: Agent, a: Dict[str, Any], inp: Input, out: Output) -> Dict[str, Any]:
    return agent.launch(a["request"])


def _fetched(agent: Agent, a: Dict[str, Any], inp: Input, out: Output) -> Dict[str, Any]:
    open(os.path.join(agent.job_dir(a["job"]), onfinish.FETCHED), "a").close()
    return {"ok": True}


def _preflight(agent: Agent, a: Dict[str, Any], inp: Input, out: Output) -> Dict[str, Any]:
    from remote_payload.helper import hostfacts as preflight  # standard library only, like this module

    facts = dict(preflight.collect(agent.root, float(a["torch_timeout"])), jobs=agent.unfinished())
    if a["usage"]:
        facts["usage"] = reclaim.usage(agent.root, agent.payload_dir)
    return facts


def _send(agent: Agent, a: Dict[str, Any], inp: Input, out: Output) -> Dict[str, Any]:
    streams.send(agent.job_dir(a["job"]), a["files"], out)
    return {}


def _send_ws(agent: Agent, a: Dict[str, Any], inp: Input, out: Output) -> Dict[str, Any]:
    streams.send(workspace.workspace_dir(agent.root, a["project"]), a["files"], out)
    return {}


HANDLERS: Dict[str, Handler] = {
    "hello": _hello,
    "receive": _receive,
    "launch": _launch,
    "status": lambda agent, a, inp, out: agent.status(a["jobs"]),
    "cancel": lambda agent, a, inp, out: agent.cancel(a["job"], float(a["grace"])),
    "resume": lambda agent, a, inp, out: agent.resume(a["job"], a["whole_job"], a["secrets"]),
    "follow": _follow,
    "tail_offset": lambda agent, a, inp, out: {
        "offset": streams.tail_offset(agent.log_path(a["job"], a["node"]), a["lines"])},
    "manifest": lambda agent, a, inp, out: agent.manifest(a["job"]),
    "send": _send,
    "send_ws": _send_ws,
    "show": lambda agent, a, inp, out: dict(repro.show(agent.job_dir(a["job"])), status=agent.probe(a["job"])),
    "fetched": _fetched,
    "free_port": lambda agent, a, inp, out: netcheck.free_port(),
    "listen": _listen,
    "tcp_check": lambda agent, a, inp, out: netcheck.tcp_check(a["host"], a["port"]),
    "preflight": _preflight,
    "move_list": lambda agent, a, inp, out: agent.move_list(a["job"]),
    "move_have": lambda agent, a, inp, out: movejob.have(agent.root, agent.job_id(a["job"]), agent.job_dir(a["job"])),
    "move_receive": lambda agent, a, inp, out: movejob.receive(agent.root, agent.job_id(a["job"]), a["files"], inp),
    "move_key": lambda agent, a, inp, out: movepull.make_key(agent.root, agent.job_id(a["job"])),
    "move_pull": lambda agent, a, inp, out: movepull.pull(
        agent.root, agent.job_id(a["job"]), a["key"], a["address"], a["port"], a["user"], a["host_key"], a["command"],
        a["files"], a["requests"]),
    "adopt": lambda agent, a, inp, out: agent.adopt(a["request"], a["files"], a["moved"]),
    "fence": lambda agent, a, inp, out: agent.fence(a["job"], a["moved_to"]),
    "queue": lambda agent, a, inp, out: gpuqueue.view(agent.root),
    "gc": lambda agent, a, inp, out: reclaim.collect(agent.root, agent.payload_dir, agent.probe, a, LOCK_WAIT_S),
}
assert set(HANDLERS) == set(protocol.REQUESTS), "every request has exactly one handler"


def handle(agent: Agent, op: str, raw_args: Any, inp: Input, out: Output) -> Dict[str, Any]:
    """One request's reply; a failure the user should read is ``{"error": ...}``."""
    held: Optional[lease.Lease] = None
    try:
        args = protocol.check_args(op, raw_args)
        if protocol.REQUESTS[op].locked:  # bounded work under the lock; a stuck holder is stopped
            os.makedirs(agent.root, exist_ok=True)
            held = lease.acquire(os.path.join(agent.root, ".lock"), op + " jobs", stall_s=LOCK_WAIT_S,
                                 max_wait_s=LOCK_WAIT_S)
        return HANDLERS[op](agent, args, inp, out)
    except (AgentError, workspace.SyncError, stage.StageError, streams.StreamError, lease.LeaseBusy,
            movejob.MoveError, gpuqueue.QueueBusy) as exc:
        return {"error": str(exc)}
    except ProtocolError as exc:
        if inp.ended:  # a bad request, read whole: the session can go on
            return {"error": "orch's helper refused the request: %s" % exc}
        raise  # a broken stream: the session cannot tell where the next frame starts
    except (OSError, ValueError, KeyError) as exc:
        return {"error": "%s: %s" % (type(exc).__name__, exc)}
    finally:
        if held is not None:
            held.release()


def serve(root: str, payload_dir: str, stdin: IO[bytes], stdout: IO[bytes]) -> int:
    """Serve requests until stdin ends: 0 at a clean end, 5 on a broken frame."""
    os.umask(private.UMASK)  # the bootstrap set it already; a helper started otherwise gets it here
    private.make_private(root)
    agent = Agent(root, payload_dir)
    stdout.write(protocol.MAGIC)
    stdout.flush()
    try:
        while True:
            got = read_frame(stdin)
            if got is None:
                return 0
            kind, payload = got
            if kind != REQUEST:
                raise ProtocolError("expected a request, got a %r frame" % kind)
            try:
                request = json.loads(payload.decode("utf-8"))
                op, args = request["op"], request.get("args", {})
            except (ValueError, KeyError, TypeError, AttributeError):
                raise ProtocolError("unreadable request")
            spec = protocol.REQUESTS.get(op) if isinstance(op, str) else None
            inp = Input(stdin)
            inp.ended = spec is None or not spec.reads
            reply = handle(agent, op, args, inp, Output(stdout))
            reply["clock"] = time.time()  # the laptop measures the clocks' offset (orchestrator/helper/clock.py)
            if "error" not in reply:
                inp.drain()
            stdout.write(frame(REPLY, json.dumps(reply).encode("utf-8")))
            stdout.flush()
            inp.drain()  # a refused stream: the laptop stops sending once it reads the reply
    except (ProtocolError, BrokenPipeError, ConnectionResetError) as exc:
        sys.stderr.write("orch helper: %s\n" % exc)
        return 5


PIPE_BYTES = 1 << 20  # Linux's ``pipe-max-size`` default: what any user may ask for
F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ on Linux (named there from Python 3.10)


def widen_pipes() -> None:
    """Give the helper's stdin and stdout pipes ``PIPE_BYTES`` of room (Linux; anything else,
    a socket, a file or a refusal once the user's pipes hold their quota, keeps its size).

    sshd writes a sync's bytes into stdin one 32 KiB channel packet at a time; in the default
    64 KiB pipe it waited for the helper every second packet, and the two took turns on the CPU
    instead of overlapping: the helper's CPU for a 70 MB first sync on loopback went 0.35 ->
    0.18 s with 1 MiB (bench/RESULTS.md, issue 26). A fetch's stdout is the same the other way."""
    if not sys.platform.startswith("linux"):
        return
    for fd in (0, 1):
        try:
            fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass  # not a pipe (EBADF/EINVAL), or over the user's pipe quota (EPERM): the default stays


def main(root: str, payload_dir: str, argv: list) -> int:
    if argv != ["serve"]:
        sys.stderr.write("orch helper: unknown command %r (this helper only serves sessions)\n" % (argv,))
        return 2
    testclock.shift_for_tests(root)
    widen_pipes()
    return serve(root, payload_dir, sys.stdin.buffer, sys.stdout.buffer)

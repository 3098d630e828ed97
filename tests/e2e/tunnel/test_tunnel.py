"""``orch tunnel`` through the CLI against the loopback sshd: a job's port at the printed local URL
(the job's launch.ports, said by submit --follow and logs -f), the same after the link was cut,
and what is refused or said without a tunnel."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import textwrap

from tests.support.orch import Orch
from tests.support.proxy import FaultProxy
from tests.support.poll import wait_until
from tests.support.sshd import SSHServer, ensure_user, free_port
from tests.support.tunnel import Running, Served, fetched, get


def test_a_job_serving_http_is_reachable_at_the_printed_url_until_ctrl_c(orch: Orch, box: str) -> None:
    port = free_port()
    ws = orch.cwd / "ws"
    ws.mkdir()
    (ws / "token.txt").write_text("served by the job")
    (orch.cwd / "job.yaml").write_text(
        f"name: web\nhosts: [{box}]\nworkspace: {{path: ws}}\n"
        f"launch: {{nproc_per_node: 1, gpus: 0, ports: [{port}], "
        f"command: python -m http.server {port} --bind 127.0.0.1}}\n")
    submit = Running(orch, "submit", "job.yaml", "--follow")
    said = submit.said("orch tunnel ")
    job = re.search(rf"serves port {port}: orch tunnel (\S+)", said)
    assert job is not None, said
    assert submit.interrupt() == 130  # stopped following: the job runs on
    logs = Running(orch, "logs", job[1], "-f")
    logs.said(f"serves port {port}: orch tunnel {job[1]}")
    assert logs.interrupt() == 130

    tunnel = Running(orch, "tunnel", job[1], "--local", "0")  # the job's launch.ports, at a free local port
    (url, local), = tunnel.urls()
    assert local != port and f"{url} -> localhost:{port} on {job[1]} on {box}" in tunnel.stdout
    fetched(f"{url}/token.txt", "served by the job")
    assert tunnel.interrupt() == 130
    assert "tunnel closed" in tunnel.stderr and "Traceback" not in tunnel.stderr
    assert get(f"{url}/token.txt") is None  # nothing listens there any more
    orch("cancel", job[1])


def test_the_tunnel_connects_again_by_itself_after_the_link_was_cut(
        orch: Orch, flaky: str, proxy: FaultProxy, served: Served) -> None:
    trace = {"ORCH_TRACE": "1"}
    wait_until(lambda: "its connection holder answered" in orch("exec", flaky, "--", "true", env=trace).stderr,
               what="the host's connection holder (started by the first command)", timeout=60)
    tunnel = Running(orch, "tunnel", flaky, str(served.port), "--local", "0", env=trace)
    (url, _), = tunnel.urls()
    assert "its connection holder answered" in tunnel.stderr  # the kept-warm connection carries it
    fetched(f"{url}/token.txt", served.token)
    proxy.cut()  # the tunnel's connection (the holder's) dropped
    tunnel.said(f"the connection to {flaky} was lost")
    tunnel.said(f"connected again to {flaky} (root@127.0.0.1:{proxy.port})")
    fetched(f"{url}/token.txt", served.token)
    proxy.cut()  # and again: the new connection is kept the same way
    tunnel.said_times(f"connected again to {flaky}", 2)
    fetched(f"{url}/token.txt", served.token)
    assert tunnel.stderr.count(f"the connection to {flaky} was lost") >= 2  # more: a holder met before it noticed
    assert tunnel.interrupt() == 130 and "Traceback" not in tunnel.stderr


def test_what_needs_no_tunnel_or_cannot_have_one_is_said_plainly(orch: Orch, box: str) -> None:
    here = orch("tunnel", "local", "8000")
    assert here.stdout.strip() == "http://127.0.0.1:8000" and "local is this machine" in here.stderr

    taken = socket.create_server(("127.0.0.1", 0))
    try:
        busy = orch("tunnel", box, "6006", "--local", str(taken.getsockname()[1]), check=2)
        assert f"local port {taken.getsockname()[1]} on 127.0.0.1 is already in use" in busy.stderr
        assert "--local 0 for a free one" in busy.stderr and "Traceback" not in busy.stderr
    finally:
        taken.close()
    assert "is not a port number" in orch("tunnel", box, "70000", check=2).stderr
    assert "name the port(s) of box" in orch("tunnel", box, check=2).stderr
    assert "is neither a host" in orch("tunnel", "no-such-thing", "80", check=2).stderr

    nothing = free_port()  # nothing listens there: that connection is closed and said, the tunnel goes on
    tunnel = Running(orch, "tunnel", box, str(nothing), "--local", "0")
    (url, _), = tunnel.urls()
    assert get(url) is None
    tunnel.said(f"localhost:{nothing}: box could not connect to localhost:{nothing}")
    assert tunnel.proc.poll() is None
    assert tunnel.interrupt() == 130


def test_the_python_api_opens_the_same_tunnel_and_closes_it(orch: Orch, box: str, served: Served) -> None:
    code = textwrap.dedent(f"""
        import json, urllib.request, orchestrator.api as o
        with o.tunnel({box!r}, [{served.port}], local=[0]) as t:
            (url,) = t.urls
            body = urllib.request.urlopen(url + "/token.txt", timeout=30).read().decode()
        try:
            o.tunnel("local", [8000])
        except o.UsageError as exc:
            refused = str(exc)
        print(json.dumps([url, body, t.lines(), refused]))
        """)
    done = subprocess.run([sys.executable, "-c", code], cwd=orch.cwd, env=orch.env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    url, body, lines, refused = json.loads(done.stdout)
    assert body == served.token and lines == [f"{url} -> localhost:{served.port} on {box}"]
    assert "local is this machine" in refused
    assert get(f"{url}/token.txt") is None  # closed with its block


def test_a_password_host_forwards_through_its_held_connection(orch: Orch, sshd: SSHServer, served: Served) -> None:
    ensure_user("orchtun", "tun-pw-7")
    pw = {"TUN_PW": "tun-pw-7", "ORCH_TRACE": "1"}
    orch("hosts", "add", "pw", "--ssh", f"ssh -p {sshd.port} orchtun@127.0.0.1", "--password-env", "TUN_PW",
         "--python", "/usr/bin/python3", "--trust", env=pw)
    wait_until(lambda: "its connection holder answered" in orch("exec", "pw", "--", "true", env=pw).stderr,
               what="the password host's connection holder", timeout=60)
    tunnel = Running(orch, "tunnel", "pw", str(served.port), "--local", "0", env=pw)
    (url, _), = tunnel.urls()
    assert "pw: its connection holder answered" in tunnel.stderr
    fetched(f"{url}/token.txt", served.token)
    assert tunnel.interrupt() == 130 and "tun-pw-7" not in tunnel.stdout + tunnel.stderr
    unset = orch("tunnel", "pw", str(served.port), "--local", "0", check=2)
    assert "$TUN_PW is not set" in unset.stderr


def test_a_stalled_link_is_closed_by_the_keepalive_and_the_tunnel_connects_again(
        orch: Orch, flaky: str, proxy: FaultProxy, served: Served) -> None:
    quick = {"ORCH_KEEPALIVE_S": "1", "ORCH_HOLD": "0"}  # its own connection: the freeze is exactly that one
    tunnel = Running(orch, "tunnel", flaky, str(served.port), "--local", "0", env=quick)
    (url, _), = tunnel.urls()
    fetched(f"{url}/token.txt", served.token)
    proxy.freeze()  # packets stop, nothing closes; new connections still flow
    tunnel.said(f"the connection to {flaky} was lost")
    tunnel.said(f"connected again to {flaky}")
    fetched(f"{url}/token.txt", served.token)
    assert tunnel.interrupt() == 130

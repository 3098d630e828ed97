"""AutoDL provider hosts through the CLI against the stand-in: power on until SSH answers, a new
port and password on every power cycle, power off, out of stock, a wrong token, a moved host key."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.orch import Orch
from tests.support.poll import wait_until
from tests.support.standin.autodl import AutoDLStandin

TOKEN_ENV = "ORCH_TEST_AUTODL_TOKEN"


def admin(standin: AutoDLStandin, action: str, **args: Any) -> dict[str, Any]:
    req = urllib.request.Request(f"{standin.url}/standin/{action}", data=json.dumps(args).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=10) as answer:
        return json.loads(answer.read())


def add(orch: Orch, standin: AutoDLStandin, name: str, index: int) -> str:
    uuid = list(standin.boxes)[index]
    orch("hosts", "add", name, "--provider", "autodl", "--instance", uuid, "--token-env", TOKEN_ENV,
         "--api-url", standin.url, "--python", "/usr/bin/python3")  # the venv is root's only
    return uuid


@pytest.fixture
def token(orch: Orch, autodl: AutoDLStandin) -> str:
    orch.env[TOKEN_ENV] = autodl.token
    return autodl.token


def system_ssh(orch: Orch, home: Path, alias: str) -> str:
    """``whoami`` through the real OpenSSH client and the block in ``home``'s ssh config."""
    done = subprocess.run(["ssh", "-F", str(home / ".ssh" / "config"), "-o", "BatchMode=yes", alias, "whoami"],
                          capture_output=True, text=True, timeout=60, env=orch.env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def secrets_absent(orch: Orch, words: list[str], *outputs: str) -> None:
    """No token or password in ORCH_HOME, the laptop's folder (runs/ fetched there) or output."""
    for path in [*orch.home.rglob("*"), *orch.cwd.rglob("*")]:
        if path.is_file():
            data = path.read_bytes()
            for word in words:
                assert word.encode() not in data, f"{word[:4]}... found in {path}"
    for text in outputs:
        for word in words:
            assert word not in text


def test_up_runs_on_the_new_port_and_password_after_every_power_cycle_and_down_stops_billing(
        orch: Orch, autodl: AutoDLStandin, token: str) -> None:
    uuid = add(orch, autodl, "a1", 0)
    box = autodl.boxes[uuid]
    listed = {h["name"]: h for h in orch.json("hosts", "ls")}
    assert listed["a1"]["provider"]["state"] == "shutdown"
    assert listed["a1"]["provider"]["price_per_hour"] == 1.98
    assert 14.9 < listed["a1"]["provider"]["release_in_days"] <= 15.0
    assert "auth" not in listed["a1"] and token not in json.dumps(listed)

    up = orch("up", "a1", "--trust")
    assert "powering on autodl instance" in up.stderr and "1.98 CNY/h" in up.stderr
    assert f"SSH answers at {box.user}@127.0.0.1:{box.port}" in up.stderr
    first = (box.port, box.password)
    entry = json.loads((orch.home / "hosts" / "a1.json").read_text())
    assert entry["price_per_hour"] == 1.98  # the provider's price: orch status's COST uses it
    assert orch("exec", "a1", "--", "whoami").stdout.strip() == box.user
    outputs = [up.stdout + up.stderr]

    # the system ssh (and so VSCode): orch's key goes in once, the block holds today's endpoint
    home = orch.cwd / "userhome"
    home.mkdir()
    orch.env["HOME"] = str(home)
    shell = orch("ssh", "a1", "--", "whoami")
    assert shell.stdout.strip() == box.user and "orch's key added to" in shell.stderr
    orch("ssh-config", "--write")
    block = (home / ".ssh" / "config").read_text()
    assert f"Port {box.port}\n" in block and "HostKeyAlias orch-a1" in block and box.password not in block
    assert system_ssh(orch, home, "orch-a1") == box.user
    outputs += [shell.stdout + shell.stderr]

    down = orch("down", "a1")
    assert box.status == "shutdown" and "a1: off" in down.stderr
    billed = autodl.ledger()[uuid]
    assert billed > 0
    off = orch("exec", "a1", "--", "true", check=3)
    assert "is shutdown; power it on with `orch up a1`" in off.stderr

    again = orch("up", "a1")  # the pinned key is checked; the new port and password just work
    assert (box.port, box.password) != first
    assert orch("exec", "a1", "--", "whoami").stdout.strip() == box.user
    assert f"Port {box.port}\n" in (home / ".ssh" / "config").read_text()  # `orch up` renewed the block
    assert system_ssh(orch, home, "orch-a1") == box.user  # same pinned key under its alias, a new port
    outputs += [again.stdout + again.stderr, down.stderr]
    orch("down", "a1")
    assert autodl.ledger()[uuid] > billed and box.sshd is None
    secrets_absent(orch, [token, first[1], box.password], *outputs)


def test_out_of_stock_is_retried_with_a_bounded_backoff_then_given_up_clearly(
        orch: Orch, autodl: AutoDLStandin, token: str) -> None:
    add(orch, autodl, "a2", 1)
    orch.env.update(ORCH_STOCK_TRIES="3", ORCH_STOCK_DELAY_S="0.2")
    admin(autodl, "stock", refusals=5)
    gave_up = orch("up", "a2", "--trust", check=4)
    assert gave_up.stderr.count("out of stock") >= 2 and "trying again in 0.2 s (1/3)" in gave_up.stderr
    assert "error: autodl power_on: 当前算力规格暂无库存, 请修改配置或稍等再试 (request_id " in gave_up.stderr
    assert autodl.request_ids[-1] in gave_up.stderr and "tried 3 times" in gave_up.stderr
    admin(autodl, "stock", refusals=1)
    ok = orch("up", "a2", "--trust")
    assert "trying again" in ok.stderr and "SSH answers" in ok.stderr
    orch("down", "a2")


def test_a_wrong_token_exits_3_with_the_providers_words_and_a_missing_one_exits_2(
        orch: Orch, autodl: AutoDLStandin, token: str) -> None:
    add(orch, autodl, "a3", 0)
    wrong = orch("up", "a3", env={TOKEN_ENV: "not-the-token"}, check=3)
    assert "error: autodl status: the token was refused (HTTP 401): token is invalid or expired" in wrong.stderr
    assert f"(request_id {autodl.request_ids[-1]})" in wrong.stderr
    assert "not-the-token" not in wrong.stderr
    unset = orch("exec", "a3", "--", "true", env={TOKEN_ENV: ""}, check=2)
    assert f"${TOKEN_ENV} is not set" in unset.stderr
    listed = orch("hosts", "ls", env={TOKEN_ENV: "not-the-token"})
    assert "token was refused" in listed.stderr and "a3" in listed.stdout


def test_hosts_check_warns_when_a_powered_off_instance_is_released_within_3_days(
        orch: Orch, autodl: AutoDLStandin, token: str) -> None:
    uuid = add(orch, autodl, "a6", 0)
    admin(autodl, "stopped", instance_uuid=uuid, days_ago=13)
    check = orch("hosts", "check", "a6")
    assert "a6: autodl instance" in check.stderr and "is shutdown, 1.98 CNY/h" in check.stderr
    assert "releases this powered-off instance in 2.0 days" in check.stderr and "orch up a6" in check.stderr
    assert "in 2.0 d" in orch("hosts", "ls").stdout
    admin(autodl, "stopped", instance_uuid=uuid, days_ago=5)
    assert "releases" not in orch("hosts", "check", "a6").stderr


def test_a_host_key_changed_by_a_reschedule_is_refused_with_both_fingerprints_and_the_fix(
        orch: Orch, autodl: AutoDLStandin, token: str) -> None:
    uuid = add(orch, autodl, "a4", 0)
    orch("up", "a4", "--trust")
    orch("down", "a4")
    admin(autodl, "move", instance_uuid=uuid)
    moved = orch("up", "a4", check=3)
    assert "DIFFERENT host key" in moved.stderr and moved.stderr.count("SHA256:") >= 2
    assert "orch hosts trust a4 --replace" in moved.stderr
    orch("hosts", "trust", "a4", "--replace")
    assert orch("exec", "a4", "--", "whoami").stdout.strip() == autodl.boxes[uuid].user
    orch("down", "a4")


def inside_shutdown(standin: AutoDLStandin, uuid: str) -> str:
    """The job's shutdown_command: the box powering itself off, as `shutdown` does inside AutoDL."""
    body = json.dumps({"instance_uuid": uuid})
    code = (f"import urllib.request as u; u.urlopen(u.Request({standin.url + '/standin/inside_shutdown'!r}, "
            f"data={body.encode()!r}), timeout=10)")
    return json.dumps(["python3", "-c", code])


def test_submit_to_a_powered_off_instance_powers_it_on_runs_and_on_finish_powers_it_off(
        orch: Orch, autodl: AutoDLStandin, token: str) -> None:
    uuid = add(orch, autodl, "a5", 1)
    box = autodl.boxes[uuid]
    orch("up", "a5", "--trust")
    orch("down", "a5")
    ws = orch.cwd / "ws"
    ws.mkdir()
    (ws / "hello.py").write_text("import os, pathlib\np = pathlib.Path('outputs'); p.mkdir(exist_ok=True)\n"
                                 "(p / 'who.txt').write_text(os.environ['USER'] if 'USER' in os.environ else 'x')\n"
                                 "print('hello from the box')\n")
    spec = orch.cwd / "job.yaml"
    spec.write_text(f"name: rented\nhosts: [a5]\nworkspace: {{path: ws}}\n"
                    f"launch: {{nproc_per_node: 1, command: python3 hello.py}}\n"
                    f"outputs: [outputs/]\n"
                    f"on_finish: {{power_off: true, shutdown_command: {inside_shutdown(autodl, uuid)}}}\n")

    asked = orch("submit", "job.yaml", check=2)  # no terminal, no --yes: nothing is powered on
    assert "a5 is off (autodl instance" in asked.stderr and "1.98 CNY/h" in asked.stderr
    assert "orch submit job.yaml --yes" in asked.stderr and box.status == "shutdown"
    dry = orch("submit", "job.yaml", "--dry-run")
    assert "would power on a5" in dry.stderr and box.status == "shutdown"
    planned = orch.json("submit", "job.yaml", "--dry-run")
    assert planned == {"dry_run": True, "power_on": [{"host": "a5", "provider": "autodl", "instance": uuid,
                                                      "state": "shutdown", "price_per_hour": 1.98, "currency": "CNY"}]}

    first = orch("submit", "job.yaml", "--yes", "--follow")
    assert "a5: powering on autodl instance" in first.stderr and "1.98 CNY/h" in first.stderr and "hello from the box" in first.stdout
    job = first.stdout.strip().splitlines()[-1]
    port = box.port
    orch("fetch", job)  # the supervisor powers the box off once the outputs were fetched
    wait_until(lambda: box.status == "shutdown", what="the supervisor to power the box off", timeout=60, interval=0.3)
    billed = autodl.ledger()[uuid]

    # The watch's move kit no longer waits FINISHING_S (120 s) for a supervisor that waits for this fetch.
    second = orch("submit", "job.yaml", "--yes", "--follow", "--watch", "--watch-interval", "0.5", timeout=110)
    assert "hello from the box" in second.stdout and box.port != port
    assert "on_finish.power_off: powering a5 off" in second.stderr and "a5: off" in second.stderr
    assert box.status == "shutdown" and autodl.ledger()[uuid] > billed
    secrets_absent(orch, [token, box.password], first.stdout + first.stderr, second.stdout + second.stderr)


def test_release_asks_refuses_a_running_instance_and_leaves_nothing_billing(
        orch: Orch, autodl: AutoDLStandin, token: str) -> None:
    """Last in the module: it gives back the second instance."""
    uuid = add(orch, autodl, "a7", 1)
    box = autodl.boxes[uuid]
    orch("up", "a7", "--trust")
    on = orch("release", "a7", "--yes", check=2)
    assert "is running; power it off first: orch down a7" in on.stderr and box.status == "running"
    orch("down", "a7")
    asked = orch("release", "a7", check=2)
    assert "orch release a7 --yes" in asked.stderr and box.status == "shutdown"
    gone = orch("release", "a7", "--yes")
    assert "released; the host entry is removed" in gone.stderr and box.status == "released"
    assert "a7" not in [h["name"] for h in orch.json("hosts", "ls")]
    billed = autodl.ledger()
    assert all(b.since is None for b in autodl.boxes.values())  # no instance left billing
    import time

    time.sleep(1.0)
    assert autodl.ledger() == billed

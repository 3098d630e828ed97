"""Hostile or broken input (issue 4): fuzzed specs, untrusted server data, secrets, moved hosts."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import SpecError
from orchestrator.spec.load import load_spec
from tests.support.orch import Orch, write_job
from tests.support.sshd import SSHServer, ensure_user, free_port, start_sshd

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=50),
                    st.binary(max_size=20).map(lambda b: b.decode("latin-1")))
trees = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(
    st.sampled_from(["name", "hosts", "train", "launch", "command", "lora", "r", "env", "x", "outputs", "data"]) | st.text(max_size=8),
    c, max_size=4)), max_leaves=30)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=trees)
def test_fuzzed_yaml_trees_are_valid_or_a_spec_error(tmp_path: Path, tree: object) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(tree, allow_unicode=True))
    try:
        load_spec(path)
    except SpecError as exc:
        assert str(exc).startswith(str(path))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(blob=st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_fuzzed_bytes_are_valid_or_a_spec_error(tmp_path: Path, blob: bytes) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(blob)
    try:
        load_spec(path)
    except SpecError:
        pass


def test_huge_and_deep_specs_are_refused_through_the_cli(orch: Orch) -> None:
    cases = {"deep.yaml": "a: " + "[" * 5000 + "]" * 5000 + "\n", "huge.yaml": "name: " + "x" * 2_000_000 + "\n",
             "tags.yaml": "name: !!python/object/apply:os.system ['touch /tmp/orch-pwned']\nhosts: [local]\n"}
    for name, text in cases.items():
        (orch.cwd / name).write_text(text)
        started = time.time()
        out = orch("check", name, check=2)
        assert "Traceback" not in out.stderr and time.time() - started < 20, name
    assert not Path("/tmp/orch-pwned").exists()


def test_logs_and_status_from_the_server_reach_the_terminal_without_escapes(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "esc", host, ["python", "esc.py"])
    (orch.cwd / "ws" / "esc.py").write_text(
        "import json, os\nprint('before \\x1b[2J\\x1b]0;pwned\\x07\\x9b31m after', flush=True)\n"
        "open(os.path.join(os.environ['ORCH_JOB_DIR'], 'metrics.jsonl'), 'w').write("
        "json.dumps({'step': '\\x1b[31m7', 'loss': 1.5}) + '\\n')\n")
    job = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]
    logs = orch("logs", job).stdout
    assert "before" in logs and "after" in logs and "\x1b" not in logs and "\x07" not in logs and "\x9b" not in logs
    table = orch("status").stdout
    assert "1.5000" in table and "\x1b" not in table


def test_malformed_status_json_is_reported_not_crashed_on(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "bad", host, ["python", "-c", "print(1)"])
    job = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]
    status_file = orch.job_dir(job) / "status.json"
    for junk in ("{not json", "[1, 2]", json.dumps({"state": 7}), "\x00" * 100):
        status_file.write_text(junk)
        with closing(sqlite3.connect(orch.home / "registry.db")) as db, db:  # make orch ask the host again
            db.execute("UPDATE jobs SET state='running' WHERE job_id=?", (job,))
        out = orch("status", job, "--json", check=None)
        assert out.returncode in (0, 4) and "Traceback" not in out.stderr, junk
        if out.returncode == 0:
            assert json.loads(out.stdout)["state"] in ("pending", "lost", "unknown"), junk


def test_passwords_never_leave_memory(orch: Orch, sshd: SSHServer) -> None:
    password = "Pw-" + os.urandom(6).hex()
    ensure_user("orchpw2", password)
    env = {"SECRET_PW": password}
    orch("hosts", "add", "pw", "--ssh", f"ssh -p {sshd.port} orchpw2@127.0.0.1", "--password-env", "SECRET_PW",
         "--python", "/usr/bin/python3", "--trust", env=env)
    spec = write_job(orch.cwd, "pw", "pw", ["python", "-c", "import time; time.sleep(3)"])
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "submit", str(spec), "--follow", "--json"],
                            cwd=orch.cwd, env={**orch.env, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen_ps = ""
    while proc.poll() is None:
        seen_ps += subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        time.sleep(0.2)
    out, err = proc.communicate()
    status = orch("status", "--json", env=env, check=None)
    texts = [out, err, seen_ps, status.stdout, status.stderr]
    for root in (orch.home, Path("/home/orchpw2/orch")):
        for path in root.rglob("*"):
            if path.is_file():
                texts.append(path.read_bytes().decode("latin-1"))
    assert all(password not in t for t in texts)
    for path in [orch.home / "registry.db", *(orch.home / "hosts").iterdir()]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert stat.S_IMODE(orch.home.stat().st_mode) == 0o700


def test_a_host_that_moved_port_says_how_to_update_it(orch: Orch, sshd: SSHServer, tmp_path: Path) -> None:
    old_port = free_port()
    orch("hosts", "add", "moved", "--ssh", f"ssh -p {old_port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root), "--python", sys.executable)
    entry = orch.home / "hosts" / "moved.json"
    entry.write_text(json.dumps(dict(json.loads(entry.read_text()), host_key=sshd.host_key_line)))
    spec = write_job(orch.cwd, "m", "moved", ["python", "-c", "print('moved ok')"])
    out = orch("submit", str(spec), check=3)
    assert f"cannot reach moved (root@127.0.0.1:{old_port})" in out.stderr
    assert 'orch hosts add moved --ssh "ssh -p PORT user@host"' in out.stderr
    # the "restarted instance": same host key, new port
    restarted = start_sshd(tmp_path / "restarted", host_key=Path(str(sshd.config.parent / "host_ed25519")))
    try:
        key = str(restarted.client_key)  # the restarted test server authorizes its own client key
        dropped = orch("hosts", "add", "moved", "--ssh", f"ssh -p {restarted.port} root@127.0.0.1", "--identity",
                       key, "--root", str(orch.remote_root), "--python", sys.executable)
        assert "pinned host key was dropped" in dropped.stderr
        orch("hosts", "add", "moved", "--ssh", f"ssh -p {restarted.port} root@127.0.0.1", "--identity",
             key, "--root", str(orch.remote_root), "--python", sys.executable)
        entry.write_text(json.dumps(dict(json.loads(entry.read_text()), host_key=sshd.host_key_line,
                                         port=old_port)))
        kept = orch("hosts", "add", "moved", "--ssh", f"ssh -p {restarted.port} root@127.0.0.1", "--identity",
                    key, "--root", str(orch.remote_root), "--python", sys.executable, "--keep-key")
        assert "dropped" not in kept.stderr and json.loads(entry.read_text())["host_key"] == sshd.host_key_line
        assert json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["state"] == "succeeded"
    finally:
        restarted.stop()

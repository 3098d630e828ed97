"""Moving a user's own script (issue 14): everything it wrote in its working directory goes
with it, so a script that resumes from its own files continues where it stopped; a transfer
cut midway continues from where it stopped, and every file is verified."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from tests.support.moves import superseded
from tests.support.orch import Orch
from tests.support.poll import wait_until
from tests.support.proxy import FaultProxy

COUNTER = """\
import json, os, pathlib, time
state = pathlib.Path("state.json")  # the script's own checkpoint, in its working directory
n = json.loads(state.read_text())["n"] if state.exists() else 0
blob = pathlib.Path("outputs/blob.bin")
if not blob.exists():
    blob.parent.mkdir(exist_ok=True)
    blob.write_bytes(os.urandom(6_000_000))
print("starting at", n, "on", os.environ["ORCH_HOST"], flush=True)
while n < 40:
    n += 1
    tmp = state.with_suffix(".tmp")
    tmp.write_text(json.dumps({"n": n}))
    os.replace(tmp, state)
    print("tick", n, flush=True)
    time.sleep(0.15)
pathlib.Path("outputs/done.txt").write_text(str(n))
"""


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_own_script_moves_with_its_files_through_a_cut_link(orch: Orch, flaky: str, proxy: FaultProxy) -> None:
    (orch.cwd / "ws").mkdir()
    (orch.cwd / "ws" / "count.py").write_text(COUNTER)
    spec = orch.cwd / "count.yaml"
    spec.write_text("name: count\nhosts: [local]\nworkspace: {path: ws}\n"
                    "launch: {nproc_per_node: 1, command: [python, count.py]}\n")
    job = json.loads(orch("submit", str(spec), "--json").stdout)["job_id"]
    old_dir = orch.job_dir(job)
    wait_until(lambda: (old_dir / "code" / "state.json").exists() and
             json.loads((old_dir / "code" / "state.json").read_text() or '{"n": 0}')["n"] >= 5,
             what="a few ticks", timeout=180)
    orch("cancel", job)
    stopped = json.loads((old_dir / "code" / "state.json").read_text())["n"]
    assert stopped < 40

    proxy.cut_after(3_000_000, "up")  # the link to the target drops halfway through the blob
    cut = orch("resume", job, "--on", flaky, check=3)
    assert "The move stopped; what arrived is kept: run the same command again" in cut.stderr
    assert "Traceback" not in cut.stderr
    assert orch.json("status", job)["hosts"] == ["local"]  # not moved: nothing half-done is reported
    stage = orch.remote_root / "jobs" / f".move-{job}"
    parts = list(stage.rglob("*.orch-part"))
    assert parts and not (orch.remote_root / "jobs" / job).exists()

    again = orch("resume", job, "--on", flaky, "--follow", timeout=300)
    copied = [line for line in again.stderr.splitlines() if "copying" in line]
    assert copied and float(copied[0].split(", ")[1].split(" MB")[0]) < 6.0  # only what had not arrived
    assert f"starting at {stopped} on flaky" in again.stdout
    new_dir = orch.remote_root / "jobs" / job
    old_dir = superseded(old_dir.parent, job)  # the attempt left behind, set aside
    assert (new_dir / "code" / "outputs" / "done.txt").read_text() == "40"
    assert sha(new_dir / "code" / "outputs" / "blob.bin") == sha(old_dir / "code" / "outputs" / "blob.bin")
    assert sha(new_dir / "code" / "count.py") == sha(old_dir / "code" / "count.py")
    assert not list(new_dir.rglob("*.orch-part")) and not stage.exists()
    assert json.loads((old_dir / "status.json").read_text())["state"] == "cancelled"
    orch("fetch", job)
    assert (orch.cwd / "runs" / job / "outputs" / "done.txt").read_text() == "40"


def test_a_direct_copy_between_servers_asks_first_and_leaves_no_key(orch: Orch, box: str, box2: str) -> None:
    (orch.cwd / "ws").mkdir()
    (orch.cwd / "ws" / "count.py").write_text(COUNTER)
    spec = orch.cwd / "count.yaml"
    spec.write_text(f"name: count\nhosts: [{box}]\nworkspace: {{path: ws}}\n"
                    "launch: {nproc_per_node: 1, command: [python, count.py]}\n")
    job = json.loads(orch("submit", str(spec), "--json").stdout)["job_id"]
    old_dir = orch.remote_root / "jobs" / job
    wait_until(lambda: (old_dir / "code" / "state.json").exists() and
             json.loads((old_dir / "code" / "state.json").read_text() or '{"n": 0}')["n"] >= 3,
             what="a few ticks", timeout=180)
    orch("cancel", job)
    authorized = Path.home() / ".ssh" / "authorized_keys"
    before = authorized.read_text() if authorized.exists() else ""

    out = orch("resume", job, "--on", box2, "--direct", "--follow", timeout=300)
    assert re.search(rf"{box2}: copying \d+ file\(s\), [\d.]+ MB directly from {box}\n", out.stderr), out.stderr
    new_dir = orch.remote_root / "box2" / "jobs" / job
    old_dir = superseded(old_dir.parent, job)
    assert (new_dir / "code" / "outputs" / "done.txt").read_text() == "40"
    assert sha(new_dir / "code" / "outputs" / "blob.bin") == sha(old_dir / "code" / "outputs" / "blob.bin")
    after = authorized.read_text() if authorized.exists() else ""
    assert "orch-move" not in after and after == before  # the temporary key is gone again
    assert not any((orch.remote_root / "box2" / ".orch-move-keys").iterdir())
    assert "directly between the servers" in orch("show", job).stdout

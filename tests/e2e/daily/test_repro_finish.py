"""Issue 6 (laptop and supervisor side): cost guard ordering, recorded environment,
`orch show`, bit-identical `orch rerun`, and bringing server-side edits back."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from safetensors.torch import load_file

from tests.support.orch import Orch, write_job

SHUTDOWN = "import pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text(str(time.time()))"


def test_shutdown_waits_for_fetch_and_never_runs_beside_another_job(orch: Orch, box: str, tmp_path: Path) -> None:
    marker = tmp_path / "powered-off"
    finish = {"shutdown": True, "shutdown_after_fetch_timeout_s": 120,
              "shutdown_command": [sys.executable, "-c", SHUTDOWN, str(marker)]}
    spec = write_job(orch.cwd, "guard", box, ["python", "-c", "print('work done')"],
                     f"on_finish: {json.dumps(finish)}\n")
    job = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]
    time.sleep(2)
    assert not marker.exists()  # succeeded, but nobody has fetched the outputs yet
    fetched_at = time.time()
    orch("fetch", job)
    deadline = time.time() + 30
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.2)
    assert float(marker.read_text()) >= fetched_at
    log = (orch.job_dir(job) / "logs" / "node0.log").read_text()
    assert log.index("waiting for `orch fetch`") < log.index("outputs fetched") < log.index("shutting down")

    marker.unlink()
    (orch.cwd / "other").mkdir()
    other = write_job(orch.cwd / "other", "busy", box, ["python", "-c", "import time; time.sleep(60)"])
    busy = orch.json("submit", str(other))["job_id"]
    orch.wait_state(busy, ("running",))
    finish["shutdown_after_fetch_timeout_s"] = 1
    spec.write_text(spec.read_text().rsplit("on_finish", 1)[0] + f"on_finish: {json.dumps(finish)}\n")
    second = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]
    log = orch.job_dir(second) / "logs" / "node0.log"
    deadline = time.time() + 30
    while "not shutting down" not in log.read_text() and time.time() < deadline:
        time.sleep(0.2)
    assert f"not shutting down: other orch jobs run here ({busy})" in log.read_text()
    assert not marker.exists()
    orch("cancel", busy, "--grace", "2")


def lora_job(orch: Orch, host: str, assets: Path) -> Path:
    ws = orch.cwd / "ws"
    shutil.copytree(assets, ws / "assets")
    (ws / "README.md").write_text("tiny\n")
    for argv in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "start"]):
        subprocess.run(["git", "-C", str(ws), *argv], check=True)
    (ws / "README.md").write_text("tiny, edited\n")  # uncommitted: recorded as a diff
    spec = orch.cwd / "lora.yaml"
    spec.write_text(json.dumps({
        "name": "again", "hosts": [host], "workspace": {"path": "ws"}, "launch": {"nproc_per_node": 1},
        "train": {"model": "assets/tiny-gpt2", "finetune": "lora", "lora": {"target_modules": ["c_attn"]},
                  "data": {"train": "assets/data/train.jsonl", "max_length": 48}, "precision": "fp32",
                  "batch_size": 4, "max_steps": 8, "eval_every": 1000, "save_every": 1000},
    }))
    return spec


def test_show_lists_the_environment_and_rerun_is_bit_identical(orch: Orch, box: str, tiny_assets: Path) -> None:
    first = json.loads(orch("submit", str(lora_job(orch, box, tiny_assets)), "--follow", "--json").stdout)
    assert first["state"] == "succeeded"
    shown = orch("show", first["job_id"]).stdout
    assert "python:   3." in shown and "torch:    2." in shown and "gpus:     none" in shown
    assert "1 uncommitted file(s)" in shown and "+tiny, edited" in shown and '"name": "again"' in shown
    (orch.cwd / "ws" / "README.md").write_text("changed after the first run: a rerun must not see it\n")
    again = json.loads(orch("rerun", first["job_id"], "--follow", "--json").stdout)
    assert again["state"] == "succeeded" and again["job_id"] != first["job_id"]
    for job in (first["job_id"], again["job_id"]):
        orch("fetch", job)
    a = load_file(orch.cwd / "runs" / first["job_id"] / "outputs" / "adapter_model.safetensors")
    b = load_file(orch.cwd / "runs" / again["job_id"] / "outputs" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    code = orch.job_dir(again["job_id"]) / "code" / "README.md"
    assert code.read_text() == "tiny, edited\n"
    assert "+tiny, edited" in orch("show", again["job_id"]).stdout


def test_pull_remote_edits_brings_server_changes_back_first(orch: Orch, box: str) -> None:
    spec = write_job(orch.cwd, "edits", box, ["python", "main.py"])
    main = orch.cwd / "ws" / "main.py"
    main.write_text("print('laptop version')\n")
    orch("submit", str(spec), "--follow")
    on_server = orch.server_workspace(orch.cwd / "ws") / "main.py"
    on_server.write_text("print('fixed in VSCode on the server')\n")
    refused = orch("submit", str(spec), check=2)
    assert "main.py" in refused.stderr and "--pull-remote-edits" in refused.stderr
    done = orch("submit", str(spec), "--pull-remote-edits", "--follow")
    assert main.read_text() == "print('fixed in VSCode on the server')\n"
    assert "fixed in VSCode on the server" in done.stdout


def test_idle_guard_powers_off_only_when_no_job_came_along(orch: Orch, sshd, tmp_path: Path) -> None:
    marker = tmp_path / "idle-off"
    orch("hosts", "add", "idle", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root), "--python", sys.executable, "--idle-shutdown-minutes", "0.1", "--trust")
    finish = f"on_finish: {json.dumps({'shutdown_command': [sys.executable, '-c', SHUTDOWN, str(marker)]})}\n"
    first = json.loads(orch("submit", str(write_job(orch.cwd, "first", "idle", ["python", "-c", "print(1)"], finish)),
                            "--follow", "--json").stdout)["job_id"]
    (orch.cwd / "b").mkdir()
    second_spec = write_job(orch.cwd / "b", "second", "idle", ["python", "-c", "import time; time.sleep(2)"], finish)
    second = json.loads(orch("submit", str(second_spec), "--follow", "--json").stdout)["job_id"]
    deadline = time.time() + 60
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.3)
    assert marker.exists()
    first_log = (orch.job_dir(first) / "logs" / "node0.log").read_text()
    assert f"idle guard: {second} started; this guard stands down" in first_log
    assert "no orch job for 0.1 min, shutting down" in (orch.job_dir(second) / "logs" / "node0.log").read_text()

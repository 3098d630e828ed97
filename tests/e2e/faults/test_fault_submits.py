"""Submits that overlap or stop (issue 23, 2, 3 and 11): a launch runs exactly the tree its own
submit sent whatever else syncs meanwhile; two submits of one job file at once start one job and
refuse the second (a live submit's reservation is never taken for an interrupted one); a submit
that fails says that it failed and why, one that was interrupted says so. Each drives the real
CLI against the loopback sshd, interleaved with ORCH_TEST_PAUSE hooks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.orch import Orch, release, submit_paused, tmpfs, write_job

V1, V2 = "print('CODE VERSION 1')\n", "print('CODE VERSION 2')\n"


def two_jobs_one_checkout(orch: Orch, host: str) -> tuple[Path, Path]:
    """Job files alpha and beta: two jobs of one checkout (one server workspace)."""
    alpha = write_job(orch.cwd, "alpha", host, ["python", "main.py"])
    beta = write_job(orch.cwd, "beta", host, ["python", "main.py"])
    ws = orch.cwd / "ws"
    (ws / "main.py").write_text(V1)
    (ws / "only-in-v1.txt").write_text("v1")
    return alpha, beta


def log_of(orch: Orch, job_id: str) -> str:
    return (orch.remote_root / "jobs" / job_id / "logs" / "node0.log").read_text()


def test_a_launch_runs_the_tree_its_own_submit_sent_when_another_submit_syncs_before_it_launches(
        orch: Orch, box: str, tmp_path: Path) -> None:
    alpha, beta = two_jobs_one_checkout(orch, box)
    first = submit_paused(orch, alpha, "after-sync", tmp_path / "hooks")  # synced V1; not launched yet
    ws = orch.cwd / "ws"
    (ws / "main.py").write_text(V2)  # the code edited between alpha's sync and its launch ...
    (ws / "only-in-v1.txt").unlink()
    (ws / "only-in-v2.txt").write_text("v2")
    second = json.loads(orch("submit", str(beta), "--follow", "--json").stdout)  # ... and beta synced it
    assert second["state"] == "succeeded" and "CODE VERSION 2" in log_of(orch, second["job_id"])
    code, out, err = release(first, "after-sync", tmp_path / "hooks")
    assert code == 0, err
    job = json.loads(out)["job_id"]
    assert orch.wait_state(job, ("succeeded", "failed"))["state"] == "succeeded"
    assert "CODE VERSION 1" in log_of(orch, job) and "CODE VERSION 2" not in log_of(orch, job)
    tree = orch.remote_root / "jobs" / job / "code"
    assert (tree / "main.py").read_text() == V1 and (tree / "only-in-v1.txt").exists()
    assert not (tree / "only-in-v2.txt").exists()  # exactly alpha's tree: nothing beta added
    assert not list((orch.remote_root / "staged").iterdir())  # each launch took its staged tree


def test_a_file_another_submit_replaced_after_this_one_planned_is_sent_again_not_run_as_replaced(
        orch: Orch, box: str, tmp_path: Path) -> None:
    alpha, beta = two_jobs_one_checkout(orch, box)
    orch("submit", str(alpha), "--follow")  # the server holds V1
    (orch.cwd / "ws" / "notes.txt").write_text("one more file")  # alpha's next sync sends it (with no change at
    traced = Orch(orch.home, orch.remote_root, dict(orch.env, ORCH_TRACE="1"), orch.cwd)  # all its hello would
    first = submit_paused(traced, alpha, "before-sync", tmp_path / "hooks")  # set V1 apart)
    main = orch.cwd / "ws" / "main.py"
    main.write_text(V2)
    second = json.loads(orch("submit", str(beta), "--follow", "--json").stdout)
    assert "CODE VERSION 2" in log_of(orch, second["job_id"])
    main.write_text(V1)  # the laptop holds what alpha planned again; the server holds beta's V2
    code, out, err = release(first, "before-sync", tmp_path / "hooks")
    assert code == 0, err
    sends = [line for line in err.splitlines() if "  send  " in line]  # its tree went as a digest, which the
    assert [('"stale": true' in s, "tree sent whole" in s) for s in sends] == [  # server's (beta's V2) is not:
        (True, False), (False, True), (False, True)]  # the tree itself, then main.py again
    assert '"differ": ["main.py"]' in sends[1] and '"staged": 3' in sends[2]
    job = json.loads(out)["job_id"]
    assert orch.wait_state(job, ("succeeded", "failed"))["state"] == "succeeded"
    assert "CODE VERSION 1" in log_of(orch, job)
    assert (orch.server_workspace(orch.cwd / "ws") / "main.py").read_text() == V1  # it was sent again


def test_a_resubmit_with_no_change_is_set_apart_in_its_hello_and_runs_that_tree_whatever_syncs_later(
        orch: Orch, box: str, tmp_path: Path) -> None:
    alpha, beta = two_jobs_one_checkout(orch, box)
    orch("submit", str(alpha), "--follow")  # the server holds V1: alpha again changes nothing
    traced = dict(orch.env, ORCH_TRACE="1")
    first = submit_paused(Orch(orch.home, orch.remote_root, traced, orch.cwd), alpha, "before-sync", tmp_path / "hooks")
    main = orch.cwd / "ws" / "main.py"
    main.write_text(V2)
    second = json.loads(orch("submit", str(beta), "--follow", "--json").stdout)  # syncs V2 before alpha launches
    assert "CODE VERSION 2" in log_of(orch, second["job_id"])
    code, out, err = release(first, "before-sync", tmp_path / "hooks")
    assert code == 0, err
    assert "set apart from the server's record in hello" in err  # no receive: its hello staged V1
    job = json.loads(out)["job_id"]
    assert orch.wait_state(job, ("succeeded", "failed"))["state"] == "succeeded"
    assert "CODE VERSION 1" in log_of(orch, job) and "CODE VERSION 2" not in log_of(orch, job)
    assert not list((orch.remote_root / "staged").iterdir())


def test_a_resubmit_with_one_change_sends_that_file_and_its_trees_digest_and_runs_exactly_that_tree(
        orch: Orch, box: str) -> None:
    alpha, _ = two_jobs_one_checkout(orch, box)
    orch("submit", str(alpha), "--follow")  # the server holds V1 and only-in-v1.txt
    ws = orch.cwd / "ws"
    (ws / "main.py").write_text(V2)
    (ws / "only-in-v1.txt").unlink()
    traced = Orch(orch.home, orch.remote_root, dict(orch.env, ORCH_TRACE="1"), orch.cwd)
    proc = traced("submit", str(alpha), "--json")
    sends = [line for line in proc.stderr.splitlines() if "  send  " in line]
    assert len(sends) == 1 and "1 file(s)" in sends[0] and "1 deleted" in sends[0], proc.stderr
    assert "tree by digest" in sends[0] and '"staged": 1' in sends[0]  # one round: no tree, nothing again
    job = json.loads(proc.stdout)["job_id"]
    assert orch.wait_state(job, ("succeeded", "failed"))["state"] == "succeeded"
    assert "CODE VERSION 2" in log_of(orch, job)
    code = orch.remote_root / "jobs" / job / "code"
    assert sorted(p.name for p in code.iterdir() if p.name != "__pycache__") == ["main.py"]


def test_two_submits_of_one_job_file_at_once_start_one_job_and_refuse_the_second(
        orch: Orch, box: str, tmp_path: Path) -> None:
    spec = write_job(orch.cwd, "twice", box, ["python", "-c", "print('ran')"])
    first = submit_paused(orch, spec, "after-sync", tmp_path / "hooks")
    reserved = orch.json("ls")[0]
    assert reserved["state"] == "submitting"
    assert f"being submitted (pid {first.pid}" in orch("status").stdout
    again = orch("submit", str(spec), check=2)
    assert "another orch submit of" in again.stderr and f"pid {first.pid}" in again.stderr
    assert reserved["job_id"] in again.stderr and "interrupted" not in again.stderr
    assert "connecting to" not in again.stderr  # refused before connecting: nothing sent twice
    code, out, err = release(first, "after-sync", tmp_path / "hooks")
    assert code == 0 and json.loads(out)["job_id"] == reserved["job_id"]
    assert [j["job_id"] for j in orch.json("ls")] == [reserved["job_id"]]
    assert len(list((orch.remote_root / "jobs").glob("twice-*"))) == 1
    later = json.loads(orch("submit", str(spec), "--json").stdout)  # once it launched: a new job
    assert later["job_id"] != reserved["job_id"] and len(orch.json("ls")) == 2


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT])
def test_a_submit_killed_or_interrupted_leaves_its_reservation_to_the_rerun(
        orch: Orch, box: str, tmp_path: Path, stop: signal.Signals) -> None:
    spec = write_job(orch.cwd, "cut", box, ["python", "-c", "print('ran once')"])
    first = submit_paused(orch, spec, "after-sync", tmp_path / "hooks")
    reserved = orch.json("ls")[0]["job_id"]
    first.send_signal(stop)
    _, err = first.communicate(timeout=60)
    assert first.returncode == (130 if stop == signal.SIGINT else -signal.SIGKILL), err
    status = orch.json("status", reserved)
    assert status["state"] == "submitting"
    assert status["reason"] == "submit was interrupted before launch: run the same orch submit again"
    done = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)
    assert done["job_id"] == reserved and done["state"] == "succeeded"
    assert log_of(orch, reserved).splitlines().count("ran once") == 1


def test_a_full_disk_during_the_sync_reads_failed_with_the_reason_never_interrupted(
        orch: Orch, sshd, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "3m") as disk:
        orch("hosts", "add", "small", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity",
             str(sshd.client_key), "--root", str(disk / "orch"), "--python", sys.executable, "--trust")
        spec = write_job(orch.cwd, "fill", "small", ["python", "-c", "print('fits')"])
        (orch.cwd / "ws" / "data.bin").write_bytes(os.urandom(4_000_000))
        out = orch("submit", str(spec), check=4)
        job = orch.json("ls")[0]["job_id"]
        assert "No space left on device" in out.stderr
        assert f"the submit failed before {job} started: the disk is full; nothing was started" in out.stderr
        assert "interrupted" not in out.stderr and "Traceback" not in out.stderr
        status = orch.json("status", job)
        assert status["reason"].startswith("submit failed before launch: the disk is full (")
        assert "No space left on device" in status["reason"] and "interrupted" not in status["reason"]
        subprocess.run(["mount", "-o", "remount,size=32m", str(disk)], check=True)
        done = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)
        assert done["job_id"] == job and done["state"] == "succeeded"


def test_a_read_only_workspace_on_the_server_reads_failed_with_the_reason(
        orch: Orch, box: str, tmp_path: Path) -> None:
    spec = write_job(orch.cwd, "ro", box, ["python", "-c", "print('ok')"])
    orch("submit", str(spec), "--follow")  # the server's workspace folder exists
    (orch.cwd / "ws" / "new.txt").write_text("new")
    ws = orch.server_workspace(orch.cwd / "ws")
    subprocess.run(["mount", "--bind", str(ws), str(ws)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ws)], check=True)
        out = orch("submit", str(spec), check=4)
    finally:
        subprocess.run(["umount", "-l", str(ws)], check=False)
    assert "Read-only file system" in out.stderr and "the filesystem is read-only; nothing was started" in out.stderr
    assert "interrupted" not in out.stderr
    reason = [j for j in orch.json("ls") if j["state"] == "submitting"][0]["reason"]
    assert reason.startswith("submit failed before launch: the filesystem is read-only")

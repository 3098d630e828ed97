"""Connections cut or stalled mid-sync, mid-fetch, mid-follow and mid-submit (issue 4, 1-4)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from remote_payload.jobdir import lease
from tests.support.orch import Orch, write_job
from tests.support.poll import wait_until
from tests.support.proxy import FaultProxy


def digest_tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def big_workspace(orch: Orch, host: str) -> Path:
    spec = write_job(orch.cwd, "big", host, ["python", "-c", "print('ok')"])
    ws = orch.cwd / "ws"
    for i in range(30):
        (ws / f"shard-{i:02d}.bin").write_bytes(os.urandom(200_000))
    return spec


def wait_until_receive_ended(root: Path, project: str) -> None:
    """The server's ``receive`` of ``project`` has ended: its lease (an flock the kernel frees
    when the process exits; remote_payload/jobdir/lease.py) is free, so its cleanup is done."""
    lock = root / "state" / f"sync-{project}.json.lock"
    wait_until(lambda: lease.holder(str(lock)) is None, what="the server's receive to end", timeout=60)


def test_sync_cut_midway_fails_cleanly_and_the_next_sync_completes(orch: Orch, flaky: str, proxy: FaultProxy) -> None:
    spec = big_workspace(orch, flaky)
    proxy.cut_after(2_000_000, "up")
    out = orch("submit", str(spec), check=3)
    assert "connection to flaky" in out.stderr and "lost" in out.stderr
    assert "Traceback" not in out.stderr and "Exception in thread" not in out.stderr
    dest = orch.server_workspace(orch.cwd / "ws")
    wait_until_receive_ended(orch.remote_root, dest.name)  # the server notices the broken stream and cleans up
    local = digest_tree(orch.cwd / "ws")
    for rel, digest in digest_tree(dest).items():
        assert ".orch-tmp-" not in rel
        assert local[rel] == digest, f"{rel} stands half-written under its final name"
    assert len(digest_tree(dest)) < len(local)  # the cut really happened mid-sync
    done = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)
    assert done["state"] == "succeeded"
    assert digest_tree(dest) == local


def test_fetch_cut_midway_resumes_from_the_part_file(orch: Orch, flaky: str, proxy: FaultProxy) -> None:
    """A cut loses at most what paramiko held for the channel (one SSH window, 8 MiB: paramiko
    sends its window adjust inside ``recv``, after taking the bytes, and a dead socket fails
    that send); everything before it is in the .part. So the cut comes 12 MB into a 24 MB file."""
    spec = write_job(orch.cwd, "out", flaky, ["python", "make.py"])
    (orch.cwd / "ws" / "make.py").write_text(
        "import os, pathlib\nout = pathlib.Path(os.environ['ORCH_JOB_DIR']) / 'outputs'\nout.mkdir()\n"
        "(out / 'weights.bin').write_bytes(os.urandom(24_000_000))\n")
    job = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]
    proxy.cut_after(12_000_000, "down")
    out = orch("fetch", job, check=3)
    assert "lost" in out.stderr or "broke off" in out.stderr
    part = orch.cwd / "runs" / job / "outputs" / "weights.bin.part"
    final = part.with_name("weights.bin")
    assert part.is_file() and 0 < part.stat().st_size < 24_000_000 and not final.exists()
    again = orch("fetch", job)
    moved_mb = float(again.stdout.split("(")[1].split(" MB")[0])
    assert moved_mb < 21.0  # resumed, not restarted (the whole file is 22.9 MB)
    assert final.read_bytes() == (orch.job_dir(job) / "outputs" / "weights.bin").read_bytes()
    assert not part.exists()


COUNTER = """\
import sys, time
for i in range(int(sys.argv[1])):
    print(f"tick {i:04d}", flush=True)
    time.sleep(0.1)
"""


def ticks_in(path: Path) -> list[str]:
    return [l for l in (path.read_text() if path.exists() else "").splitlines() if l.startswith("tick ")]


def follow_ticking_job(orch: Orch, host: str, name: str, ticks: int,
                       heartbeat_s: str) -> tuple[subprocess.Popen, Path, Path]:
    """Submit a job printing ``ticks`` numbered lines and start `orch logs -f` on it (watchdog
    period 1 s, its stdout into a file); return (follower, its stdout file, the job's log)
    once the follower has printed line 10 — its stream is open and flowing then."""
    spec = write_job(orch.cwd, name, host, ["python", "tick.py", str(ticks)])
    (orch.cwd / "ws" / "tick.py").write_text(COUNTER)
    job = orch.json("submit", str(spec))["job_id"]
    printed = orch.cwd.parent / f"{name}.out"
    with open(printed, "w") as sink:
        follower = subprocess.Popen([sys.executable, "-m", "orchestrator", "logs", job, "-f"], cwd=orch.cwd,
                                    env={**orch.env, "ORCH_LOG_HEARTBEAT_S": heartbeat_s, "ORCH_KEEPALIVE_S": "1"},
                                    stdout=sink, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: "tick 0010" in ticks_in(printed), what="the follower to print line 10", timeout=60)
    return follower, printed, orch.remote_root / "jobs" / job / "logs" / "node0.log"


def test_logs_follow_survives_a_cut_and_a_stall_without_losing_or_repeating_a_line(
        orch: Orch, flaky: str, proxy: FaultProxy) -> None:
    follower, printed, log = follow_ticking_job(orch, flaky, "tick", 120, heartbeat_s="0.5")
    proxy.cut()
    written = len(ticks_in(log))  # a line after these can only come through a new connection
    wait_until(lambda: len(ticks_in(printed)) > written, what="the follower to reconnect", timeout=60)
    proxy.freeze()  # the reconnected stream now stalls without closing
    _, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    assert ticks_in(printed) == [f"tick {i:04d}" for i in range(120)]
    assert "reconnecting" in err and "stalled" in err


def test_a_stalled_link_is_noticed_by_the_keepalive_not_waited_on_forever(
        orch: Orch, flaky: str, proxy: FaultProxy) -> None:
    follower, printed, _ = follow_ticking_job(orch, flaky, "quiet", 100, heartbeat_s="600")
    proxy.freeze()  # the link stops answering without closing; the log heartbeat is far away
    _, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    assert ticks_in(printed) == [f"tick {i:04d}" for i in range(100)]
    assert "(stalled)" in err


def _submit_cut_at(orch: Orch, flaky: str, proxy: FaultProxy, point: str, tmp_path: Path,
                   cut: Callable[[], None] | None = None) -> tuple[Path, subprocess.Popen]:
    """Submit, pause at ``point``, cut the link there (or as ``cut`` arranges), go on: exit 3.
    The submit's own connection only (no kept-warm one), so the cut is exactly where it says."""
    spec = write_job(orch.cwd, "once", flaky, ["python", "-c", "print('ran once')"])
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "submit", str(spec)], cwd=orch.cwd,
                            env={**orch.env, "ORCH_TEST_PAUSE": f"{point}:{hooks}", "ORCH_HOLD": "0"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until((hooks / f"{point}.reached").exists, what=f"submit to reach {point}", timeout=60)
    (cut or proxy.cut)()
    (hooks / f"{point}.go").touch()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert "the submit was interrupted before" in err and "failed before" not in err  # issue 23, 11
    return spec, proc


def test_submit_cut_after_sync_starts_nothing_and_the_rerun_starts_once(
        orch: Orch, flaky: str, proxy: FaultProxy, tmp_path: Path) -> None:
    spec, _ = _submit_cut_at(orch, flaky, proxy, "after-sync", tmp_path)
    assert not list((orch.remote_root / "jobs").glob("once-*"))
    assert "submit was interrupted before launch" in orch("status").stdout
    assert orch.json("ls")[0]["state"] == "submitting"
    done = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)
    assert done["state"] == "succeeded"
    assert len(list((orch.remote_root / "jobs").glob("once-*"))) == 1


def test_submit_cut_right_after_launch_never_starts_a_duplicate(
        orch: Orch, flaky: str, proxy: FaultProxy, tmp_path: Path) -> None:
    # the rest of the request goes up, the server launches; its reply is what cuts the link
    spec, _ = _submit_cut_at(orch, flaky, proxy, "launch-half-sent", tmp_path, cut=lambda: proxy.cut_after(0, "down"))
    again = orch("submit", str(spec), "--follow", "--json")
    assert "already started by an interrupted submit" in again.stderr
    jobs = list((orch.remote_root / "jobs").glob("once-*"))
    assert len(jobs) == 1 and json.loads(again.stdout)["job_id"] == jobs[0].name
    lines = (jobs[0] / "logs" / "node0.log").read_text().splitlines()
    assert lines.count("ran once") == 1 and sum(l.startswith("[orch] starting:") for l in lines) == 1
    assert len(orch.json("ls")) == 1
    assert not list((orch.remote_root / "staged").iterdir())  # the rerun's staged code is not left behind


def test_a_thread_cut_off_with_its_connection_prints_no_traceback(orch: Orch, flaky: str, proxy: FaultProxy) -> None:
    """`orch exec` pumps its stdin to the server in a thread of its own: cutting the link
    while that thread writes kills it mid-write. The command fails once, cleanly (exit 3,
    the host named); no thread prints `Exception in thread` or a traceback."""
    proxy.cut_after(3_000_000, "up")
    with open("/dev/zero", "rb") as endless:  # stdin that never ends: the pump is writing when the cut comes
        out = subprocess.run([sys.executable, "-m", "orchestrator", "exec", flaky, "--", "cat > /dev/null"],
                             cwd=orch.cwd, env=orch.env, stdin=endless, capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, out.stderr
    assert "connection to flaky" in out.stderr and "lost" in out.stderr
    assert "Traceback" not in out.stderr and "Exception in thread" not in out.stderr, out.stderr

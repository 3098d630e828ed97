"""`orch fetch JOB --watch` (issue 14, point 3): the laptop's copy follows a running job —
each new complete checkpoint lands whole, older ones are pruned like the server's, a dropped
link is retried — and the watch ends by itself with a final fetch equal to a plain fetch.

The job writes checkpoints the way the built-in trainer does (``tmp-<N>/``, ``COMPLETE``
last, renamed to ``step-<N>/``, older ones pruned to ``keep``), each one only once the test
opens its gate, so every step of a test waits on a condition, never on a clock."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.e2e.faults.conftest import proxy  # noqa: F401 - the fixture
from tests.support.orch import Orch, dead_port, write_job
from tests.support.poll import wait_until
from tests.support.proxy import FaultProxy
from tests.support.sshd import SSHServer

CKPT_FILES = {"model.bin", "optim.bin", "progress.json", "COMPLETE"}
JOB = """\
import json, os, pathlib, shutil, sys, time
job = pathlib.Path(os.environ["ORCH_JOB_DIR"])
root = job / "checkpoints"
root.mkdir(exist_ok=True)
steps, keep = int(sys.argv[1]), int(sys.argv[2])
def allowed():
    try:
        return int((job / "gate").read_text())
    except (OSError, ValueError):
        return 0
for step in range(1, steps + 1):
    while allowed() < step:
        time.sleep(0.05)
    tmp = root / f"tmp-{step}"
    tmp.mkdir()
    for name in ("model.bin", "optim.bin"):
        (tmp / name).write_bytes(os.urandom(400_000))
    (tmp / "progress.json").write_text(json.dumps({"step": step}))
    (tmp / "COMPLETE").write_text(f"step {step}\\n")
    tmp.rename(root / f"step-{step}")
    for old in sorted(root.glob("step-*"), key=lambda p: int(p.name[5:]))[:-keep]:
        shutil.rmtree(old)
    with open(job / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": step, "loss": 1.0 / step}) + "\\n")
    print("step", step, flush=True)
sys.exit(int(os.environ.get("JOB_EXIT", "0")))
"""


def digest_tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def submit(orch: Orch, host: str, steps: int, keep: int, extra: str = "") -> str:
    spec = write_job(orch.cwd, "ckpt", host, ["python", "ckpt.py", str(steps), str(keep)], extra)
    (orch.cwd / "ws" / "ckpt.py").write_text(JOB)
    return orch.json("submit", str(spec))["job_id"]


class Watcher:
    """``orch fetch JOB --watch`` in the background; its stderr kept in a file to poll."""

    def __init__(self, orch: Orch, args: list[str]) -> None:
        self.err_path = orch.cwd / f"watch-{time.monotonic_ns()}.err"
        self.err = open(self.err_path, "w")
        # in a process of its own (ORCH_WARM=0): a SIGSTOP of it is a laptop asleep (of a command
        # handed to the warm server, it would stop only the client that waits for it)
        self.proc = subprocess.Popen([sys.executable, "-m", "orchestrator", *args], cwd=orch.cwd,
                                     env={**orch.env, "ORCH_WARM": "0"}, stdout=subprocess.PIPE, stderr=self.err,
                                     text=True)

    def stderr(self) -> str:
        return self.err_path.read_text()

    def finish(self, timeout: float = 120) -> tuple[int, str, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        self.err.close()
        return self.proc.returncode, out, self.stderr()


class Inspector:
    """Checks the laptop's checkpoints folder over and over while the watch runs: every
    ``step-*`` folder there is whole (all files, COMPLETE, the server's bytes)."""

    def __init__(self, local: Path, server: Path) -> None:
        self.local, self.server, self.problems, self.looks = local, server, [], 0
        self.seen: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.look()
            time.sleep(0.01)

    def look(self) -> None:
        self.looks += 1
        try:
            folders = [p for p in self.local.iterdir() if p.name.startswith("step-")]
        except OSError:
            return
        for folder in folders:
            try:
                names = {p.name for p in folder.iterdir()}
            except FileNotFoundError:
                continue  # renamed away (pruned) between the listing and this look
            self.seen.add(folder.name)
            if names != CKPT_FILES:
                self.problems.append(f"{folder.name} holds {sorted(names)}")
            for name in names & {"model.bin", "optim.bin"}:
                try:
                    theirs = (self.server / folder.name / name).read_bytes()
                except OSError:
                    continue  # pruned on the server meanwhile
                if (folder / name).read_bytes() != theirs:
                    self.problems.append(f"{folder.name}/{name} differs from the server's")

    def close(self) -> list[str]:
        self.stop.set()
        self.thread.join()
        return self.problems


def steps_here(folder: Path) -> set[int]:
    return {int(p.name[5:]) for p in folder.glob("step-*")} if folder.is_dir() else set()


def open_gate(orch: Orch, job: str, step: int) -> None:
    (orch.job_dir(job) / "gate").write_text(str(step))


def release_each_step(orch: Orch, job: str, local: Path, steps: int = 3) -> None:
    """Let the job write its checkpoints one at a time, each only once the watch has it here."""
    for step in range(1, steps + 1):
        open_gate(orch, job, step)
        wait_until(lambda: step in steps_here(local), what=f"step-{step} on the laptop", timeout=90)


def assert_final_fetch_equals_a_plain_fetch(orch: Orch, job: str) -> None:
    """A plain fetch after the watch moves nothing, and the laptop's copy is the server's
    selection (checkpoints included), no hidden folder or .part left (the move kit,
    ``.orch-job/``, is kit.py's and not compared here)."""
    again = orch("fetch", job, "--checkpoints")
    assert ": 0 fetched (0.0 MB)" in again.stdout, again.stdout
    local = {k: v for k, v in digest_tree(orch.cwd / "runs" / job).items()
             if k != ".orch-run" and not k.startswith(".orch-job/")}  # the move kit: kit.py's own
    server = digest_tree(orch.job_dir(job))
    selected = {k: v for k, v in server.items()
                if k.startswith(("checkpoints/", "logs/", "outputs/")) or k == "metrics.jsonl"}
    assert local == selected


def test_watch_keeps_whole_checkpoints_current_prunes_them_and_ends_with_the_job(orch: Orch, host: str) -> None:
    job = submit(orch, host, steps=4, keep=2)
    local, job_dir = orch.cwd / "runs" / job / "checkpoints", orch.job_dir(job)
    watch = Watcher(orch, ["fetch", job, "--watch", "--interval", "0.2"])
    inspector = Inspector(local, job_dir / "checkpoints")
    try:
        for step in range(1, 4):
            open_gate(orch, job, step)
            wait_until(lambda: step in steps_here(local), what=f"step-{step} on the laptop", timeout=90)
            assert watch.proc.poll() is None  # the job still runs: the watch goes on
        wait_until(lambda: steps_here(local) == {2, 3}, what="step-1 pruned like on the server", timeout=90)
        watch.proc.send_signal(signal.SIGSTOP)  # a laptop asleep: no round for a while ...
        # ... and no other orch runs meanwhile either (asleep, it stops them all; a SIGSTOP may
        # land inside the watch's write to registry.db): the gate is opened by hand
        (job_dir / "gate").write_text("4")
        wait_until(lambda: json.loads((job_dir / "status.json").read_text())["state"] == "succeeded",
                   what="the job to end", timeout=90)
        watch.proc.send_signal(signal.SIGCONT)  # ... then awake: the next round catches up
        code, out, err = watch.finish()
    finally:
        watch.proc.kill()
        problems = inspector.close()
    assert code == 0, err
    assert not problems, problems[:5]
    assert inspector.seen >= {"step-1", "step-2", "step-3"}
    assert steps_here(local) == {3, 4} and not list(local.glob(".*"))
    assert "new checkpoint checkpoints/step-1" in err and "removed checkpoints/step-1" in err
    assert f"{job} succeeded" in err and "fetched while watching" in out
    assert "Traceback" not in err and "link lost" not in err
    assert_final_fetch_equals_a_plain_fetch(orch, job)


def test_watch_of_a_failing_job_exits_1_and_keep_checkpoints_keeps_them_all(orch: Orch, box: str) -> None:
    job = submit(orch, box, steps=3, keep=1, extra="env: {JOB_EXIT: '3'}\n")
    local = orch.cwd / "runs" / job / "checkpoints"
    watch = Watcher(orch, ["fetch", job, "--watch", "--interval", "0.2", "--keep-checkpoints"])
    try:
        release_each_step(orch, job, local)
        code, out, err = watch.finish()
    finally:
        watch.proc.kill()
    assert code == 1, err
    assert f"{job} failed" in err and "removed" not in err
    assert steps_here(local) == {1, 2, 3}  # the server keeps only step-3
    assert {p.name for p in (local / "step-2").iterdir()} == CKPT_FILES


def test_interval_and_keep_checkpoints_need_watch(orch: Orch) -> None:
    out = orch("fetch", "some-job", "--keep-checkpoints", check=2)
    assert "go with --watch" in out.stderr and "Traceback" not in out.stderr


def test_watch_survives_a_dropped_link_and_still_ends_with_the_job(orch: Orch, sshd: SSHServer,
                                                                     proxy: FaultProxy) -> None:
    orch("hosts", "add", "flaky", "--ssh", f"ssh -p {proxy.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root), "--python", sys.executable, "--trust")
    job = submit(orch, "flaky", steps=3, keep=2)
    local = orch.cwd / "runs" / job / "checkpoints"
    server = orch.remote_root / "jobs" / job / "checkpoints"
    watch = Watcher(orch, ["fetch", job, "--watch", "--interval", "0.2"])
    inspector = Inspector(local, server)
    try:
        open_gate(orch, job, 1)
        wait_until(lambda: 1 in steps_here(local), what="step-1 on the laptop", timeout=90)
        proxy.target = dead_port()  # the link goes down: open connections cut, new ones refused
        proxy.cut()
        wait_until(lambda: "link lost" in watch.stderr(), what="the watch to notice the outage", timeout=90)
        open_gate(orch, job, 2)  # the job goes on meanwhile
        wait_until(lambda: steps_here(server) == {1, 2}, what="step-2 on the server", timeout=90)
        assert watch.proc.poll() is None and 2 not in steps_here(local)
        proxy.target = sshd.port  # the link is back
        wait_until(lambda: 2 in steps_here(local), what="step-2 on the laptop after the outage", timeout=90)
        open_gate(orch, job, 3)
        code, out, err = watch.finish()
    finally:
        watch.proc.kill()
        problems = inspector.close()
    assert code == 0, err
    assert not problems, problems[:5]
    assert err.count("link lost") == 1 and err.count("link back") == 1, err
    assert err.index("link lost") < err.index("link back") and "Traceback" not in err
    assert steps_here(local) == {2, 3}
    assert_final_fetch_equals_a_plain_fetch(orch, job)


def test_submit_follow_watch_streams_the_log_and_keeps_the_copy_current(orch: Orch, box: str) -> None:
    spec = write_job(orch.cwd, "ckpt", box, ["python", "ckpt.py", "3", "2"])
    (orch.cwd / "ws" / "ckpt.py").write_text(JOB)
    watch = Watcher(orch, ["submit", str(spec), "--follow", "--watch", "--watch-interval", "0.2"])
    try:
        jobs = orch.remote_root / "jobs"

        def launched() -> list[Path]:
            return [p for p in jobs.glob("ckpt-*") if (p / "status.json").is_file()] if jobs.is_dir() else []

        wait_until(lambda: bool(launched()), what="the job folder on the server", timeout=90)
        job = launched()[0].name
        local = orch.cwd / "runs" / job / "checkpoints"
        release_each_step(orch, job, local)
        code, out, err = watch.finish()
    finally:
        watch.proc.kill()
    assert code == 0, err
    assert out.strip().splitlines()[-1] == job
    assert "step 3" in out and "new checkpoint checkpoints/step-3" in err and "fetched while watching" in err
    assert_final_fetch_equals_a_plain_fetch(orch, job)


SLOW_WRITER = """\
import os, pathlib, time
job = pathlib.Path(os.environ["ORCH_JOB_DIR"])
step = job / "checkpoints" / "step-1"
step.mkdir(parents=True)
(step / "model.bin").write_bytes(os.urandom(300_000))
(job / "half").touch()
while not (job / "gate").exists():
    time.sleep(0.05)
(step / "optim.bin").write_bytes(os.urandom(300_000))
(step / "COMPLETE").write_text("step 1\\n")
"""


def test_a_checkpoint_folder_lands_whole_and_a_damaged_one_is_completed_aside(orch: Orch, box: str) -> None:
    """A plain fetch follows the same rule: a checkpoint folder written in place is not taken
    while the job runs and lacks COMPLETE; once whole it lands whole; a local copy that no
    longer matches is moved aside, completed, and renamed back."""
    spec = write_job(orch.cwd, "slow", box, ["python", "slow.py"])
    (orch.cwd / "ws" / "slow.py").write_text(SLOW_WRITER)
    job = orch.json("submit", str(spec))["job_id"]
    wait_until(lambda: (orch.job_dir(job) / "half").exists(), what="the half-written checkpoint", timeout=90)
    orch("fetch", job, "--checkpoints")
    local = orch.cwd / "runs" / job / "checkpoints"
    assert not (local / "step-1").exists() and not list(local.glob(".part-*"))
    open_gate(orch, job, 1)
    assert orch.wait_state(job, ("succeeded",))["state"] == "succeeded"
    orch("fetch", job, "--checkpoints")
    assert {p.name for p in (local / "step-1").iterdir()} == {"model.bin", "optim.bin", "COMPLETE"}
    model = local / "step-1" / "model.bin"
    model.write_bytes(b"\0" * model.stat().st_size)  # damaged on the laptop
    (local / "step-1" / "optim.bin").unlink()
    (local / "step-1" / "stray.txt").write_text("not the server's")
    out = orch("fetch", job, "--checkpoints")
    assert ": 2 fetched" in out.stdout
    assert digest_tree(local / "step-1") == digest_tree(orch.job_dir(job) / "checkpoints" / "step-1")
    assert [p.name for p in local.iterdir()] == ["step-1"]

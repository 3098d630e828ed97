"""The per-node supervisor: setup, then the job (under torchrun, or started directly), then
manifest and state.

Started detached (new session, all three streams redirected) by the helper's ``launch`` (``helper/agent.py``), so it
survives the SSH session ending and SIGHUP. Standard library only. Contract (docs/architecture.md):

- ``status.json`` is rewritten atomically: state, pids, process group, boot id, heartbeat,
  exit code, reason. A terminal state is written only after ``manifest.json`` is complete.
- A full disk never loses the end: room for the terminal status is set aside at the start
  (``jobdir/reserve.py``) and given up when a write at the end meets a full disk. A job during
  which a write of orch's met a full disk, or whose disk is full when it ends, ends ``failed``
  with ``disk full`` and the path in its reason, never ``succeeded``; no temporary is left.
- Its background duties (``jobdir/duties.py``) — the heartbeat, the manifest of what the job
  wrote so far, the metrics read from the log — share one error policy: an error is said
  once in the node's log with the duty's name, the duty runs again on its next period and
  says when it works again; none is ever stopped by an error (a transient ``OSError`` on the
  job folder does not end the heartbeat).
- The end is fast: the recorded environment (``repro.Recorder``) and a manifest of what the job
  has written so far (``ManifestCache``) are made while the job runs, so after its last process
  exits only new or changed files are hashed before the terminal state. A record still running
  then is not waited for: it lands a moment later and ``manifest.json`` is refreshed with it.
- A direct start (the plan's ``direct``: one node, one process) runs ``argv`` itself with the
  environment torchrun would give that one worker (``direct_env``), or, ``plain`` (a user's
  command under ``launcher: auto``), with none of it, as a plain ``python`` start.
- While the job runs, ``joinwatch`` reads its log for a process group whose ranks never all
  joined (Lightning's ``MEMBER 1/2`` and then nothing): status.json's reason says so.
- ``logs/node<N>.log`` holds setup output, the job's output and ``[orch]`` lines; it is
  only ever appended to, so readers can follow it by byte offset.
- Before setup the node waits for its GPUs in the host's queue (``gpuqueue.take``: state
  ``queued``), gets them as ``CUDA_VISIBLE_DEVICES`` and gives them back in ``finish``.
- SIGTERM (``orch cancel``) goes to every process of the job's tree (see jobdir/processes.py); after
  ``grace_s`` what is left is killed. The job then ends ``cancelled``.
- With a ``budget`` (``max_cost``) the ``budget`` duty (``budget.py``) cancels the job the same
  way when its cost reaches it; it ends ``cancelled`` with ``stopped: max_cost ... reached`` as
  its reason, ``budget_reached`` in status.json, and ``on_finish`` powers off without a fetch.
- In a Slurm allocation (job.json has ``slurm``; ``allocation.py``) the job runs as one srun
  step across the allocation's nodes; SIGUSR1 is the time-limit warning, and a SIGTERM
  that is not ``orch cancel`` ends the job with the state Slurm names.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional

if __name__ == "__main__":  # run as a script: imports start at the payload folder, not this script's own
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from remote_payload.contract import settings  # noqa: E402
from remote_payload.contract.jobfolder import atomic_write_json, read_json  # noqa: E402
from remote_payload.contract.protocol import GRACE_S, TERMINAL  # noqa: E402
from remote_payload.gpuqueue import queue as gpuqueue  # noqa: E402
from remote_payload.jobdir import processes, testclock  # noqa: E402
from remote_payload.jobdir import record as repro  # noqa: E402
from remote_payload.jobdir.duties import Duty  # noqa: E402
from remote_payload.jobdir.manifest import Flock, ManifestCache, build_manifest, file_key  # noqa: E402
from remote_payload.jobdir.processes import boot_id  # noqa: E402
from remote_payload.jobdir.reserve import Reserve, disk_full, full_at  # noqa: E402
from remote_payload.supervisor import (  # noqa: E402
    allocation,  # noqa: E402
    attempt,
    budget,
    environment,
    failure,
    joinwatch,
    launchers,
    metricswatch,
    onfinish,
    secrets,
    webhook,
)
from remote_payload.supervisor.direct import direct_env, free_port  # noqa: E402

WARNED_BEFORE_START = 143  # the step's exit code when Slurm's time-limit warning came before it started
# Rich (Lightning's default bar when rich is installed) draws nothing but the end into a file;
# with these set, as a terminal would be, its bar redraws like tqdm's and metricswatch reads it.
# A job's env (or the server's) naming any of them is left as it is.
RICH_TTY_KEYS = ("TTY_COMPATIBLE", "TTY_INTERACTIVE", "FORCE_COLOR")
RECORD_DELAY_S = 1.0  # the environment record begins this long after the job, or once its state is written
TRAINER_MODULES = ("torch", "transformers", "peft", "safetensors", "pydantic", "numpy")
TRAINER_NEEDS = ("the built-in trainer needs %s on this host's python: add to the job's setup: "
                 "python -m pip install transformers peft safetensors pydantic")


class Supervisor:
    def __init__(self, job_dir: str, node_rank: int) -> None:
        self.job_dir, self.node_rank = job_dir, node_rank
        self.job: Dict[str, Any] = read_json(os.path.join(job_dir, "job.json")) or {}
        self.node: Dict[str, Any] = self.job["nodes"][node_rank]
        self.status_path = os.path.join(job_dir, "status.json")
        self.lock = threading.Lock()
        self.cancelled = threading.Event()
        self.warned = threading.Event()  # Slurm's time-limit warning (SIGUSR1)
        self.slurm = bool(self.job.get("slurm"))
        self.child: Optional[subprocess.Popen] = None
        self.stopped_child: Optional[subprocess.Popen] = None  # the child the time-limit warning stopped
        self.ended_child: Optional[subprocess.Popen] = None  # the last child run_step saw end (under tree_lock)
        self.tree_lock = threading.Lock()  # a stop's look at the tree vs. run_step moving past its child's end
        self.stepping = False  # the job's own step runs (in an allocation: srun's), not the setup
        self.recorder: Optional[repro.Recorder] = None
        self.watcher: Any = None  # the metrics watch (metricswatch.watch): its pattern worker is not the job's
        self.progress_note: Optional[str] = None  # launch.progress switched off: the reason status shows
        self.alone_note: Optional[str] = None  # ranks that each trained alone (joinwatch): in the end's reason
        self.manifests: Optional[ManifestCache] = None
        self.manifest_written: Optional[tuple] = None  # (inode, size, mtime) of the manifest.json finish() wrote
        self.reserve = Reserve(job_dir)
        self.disk_error: Optional[str] = None  # the first write of orch's that met a full disk: "PATH: error"
        old = read_json(self.status_path) or {}
        number = int(old.get("attempt", 0)) + 1
        now = time.time()
        self.status: Dict[str, Any] = {
            "job_id": self.job["job_id"], "node_rank": node_rank, "state": "setting_up",
            "supervisor_pid": os.getpid(), "pgid": None, "child_pid": None, "boot_id": boot_id(),
            "started": now, "ended": None, "heartbeat": now, "exit_code": None,
            "reason": None, "attempt": number,
            # across attempts (orch resume): when the first began, and the step the ones before reached
            "first_started": (old.get("first_started") or old.get("started") or now) if number > 1 else now,
            "resumed_from_step": attempt.reached_step(job_dir) if number > 1 else None,
            "run_s_before": budget.run_s_before(old) if number > 1 else 0.0,  # what earlier attempts ran
        }
        os.makedirs(os.path.join(job_dir, "logs"), exist_ok=True)
        self.log = open(os.path.join(job_dir, "logs", "node%d.log" % node_rank), "ab", buffering=0)
        self.heartbeat = Duty("heartbeat", float(self.job.get("heartbeat_s", 2.0)), self.beat, self.say)
        self.budget_reason: Optional[str] = None  # set when max_cost stopped the job (budget.py)
        self.budget = budget.watch(self.job, now, float(self.status["run_s_before"]), self.stop_for_budget, self.say)

    # -- state -------------------------------------------------------------------------
    def update(self, final: bool = False, **fields: Any) -> None:
        """Record the status. A write that meets a full disk is noted (``disk_full_at``) and
        skipped while the job runs; the ``final`` one gives up the reserve and tries again, and
        raises only when that fails too."""
        with self.lock:
            procs = self.job_procs() if self.child is not None else []
            self.status.update(fields, heartbeat=time.time(), procs=[list(p) for p in procs])
            try:
                atomic_write_json(self.status_path, self.status)
            except OSError as exc:
                if not disk_full(exc):
                    raise
                self.disk_full_at(self.status_path, exc)
                if final:
                    self.reserve.release()
                    atomic_write_json(self.status_path, self.status)

    def disk_full_at(self, path: str, exc: OSError) -> None:
        if self.disk_error is None:
            self.disk_error = "%s: %s" % (path, exc.strerror or exc)

    def say(self, message: str) -> None:
        """A ``[orch]`` line in the node's log, a secret's value redacted; never raises (a full
        disk is noted)."""
        message = secrets.redact(message, self.job, os.environ)
        try:
            self.log.write(("[orch] %s\n" % message).encode("utf-8", "replace"))
        except OSError as exc:
            if disk_full(exc):
                self.disk_full_at(self.log.name, exc)

    def beat(self) -> None:
        """One heartbeat (the duty ``heartbeat``): status.json rewritten with the time, until
        the job's state is terminal. An error (an ``ESTALE`` on an NFS job folder) raises to the
        duty, which says it once and beats again on the next period."""
        if self.status["state"] not in TERMINAL:
            self.update()

    def on_sigterm(self, signum: int, frame: Any) -> None:
        """Cancel: SIGTERM the whole tree (torchrun and its workers, each in its own
        session), SIGKILL whatever is left after ``grace_s``."""
        self.cancelled.set()
        if self.child is not None:
            grace = float(self.job.get("grace_s", GRACE_S))
            threading.Thread(target=self._stop_tree, args=(grace,), daemon=True).start()

    def note_progress_off(self, text: str) -> None:
        """``launch.progress`` was switched off (the metrics watch, once): status.json's reason
        says so while the job runs, and at its end unless the end has a reason of its own."""
        self.progress_note = text
        if self.status.get("reason") is None and self.status["state"] not in TERMINAL:
            self.update(reason=text)

    def note_alone(self, text: str) -> None:
        """Several ranks each trained alone (``joinwatch``, once): status.json's reason while the
        job runs, and added to the reason its end gives."""
        self.alone_note = text
        if self.status["state"] not in TERMINAL:
            self.update(reason=text)

    def note_ranks(self, text: Optional[str]) -> None:
        """The join watch's reason (``joinwatch``: ranks of a process group never joined) as
        status.json's reason while the job runs; None takes it back."""
        if self.status["state"] not in TERMINAL:
            self.update(reason=text or self.alone_note or self.progress_note)

    def stop_for_budget(self, reason: str) -> None:
        """``max_cost`` is reached (the ``budget`` duty, once): say it, record it, and cancel the
        job as ``orch cancel``'s SIGTERM does; it ends ``cancelled`` with ``reason``."""
        self.budget_reason = reason
        self.say(reason + ": stopping the job as orch cancel does")
        self.update(budget_reached=True)
        self.on_sigterm(signal.SIGTERM, None)

    def on_warning(self, signum: int, frame: Any) -> None:
        """Slurm's time-limit warning: stop the job gracefully (it checkpoints), not cancelled.
        Before the job's step runs (the GPU queue, setup) it stops what runs then, and the step
        is never started (``run_step`` checks ``warned``): with ``requeue`` the next allocation
        starts it, else the job ends at the warning, never at Slurm's hard limit."""
        self.warned.set()
        self.say("Slurm's time-limit warning: stopping the job so that it checkpoints")
        self._stop_at_warning()

    def _stop_at_warning(self) -> None:
        """Stop the running child once per child (signal handlers and ``run_step`` both run in
        the main thread: no two of these interleave)."""
        if self.child is not None and self.stopped_child is not self.child:
            self.stopped_child = self.child
            threading.Thread(target=self._stop_tree, args=(float(self.job.get("grace_s", GRACE_S)),),
                             daemon=True).start()

    def _stop_tree(self, grace: float) -> None:
        """SIGTERM, then SIGKILL after ``grace``, to the running child's tree. In a Slurm
        allocation the job's processes are not this tree's (slurmstepd starts them): they get
        SIGTERM through Slurm first, and srun is stopped only if they outlive ``grace``. The
        setup runs in this tree: stopped directly. Once ``run_step`` saw the child end it stops
        what is left of it itself, and what runs after (the requeue's ``scontrol``, the end's
        records) is not the child's: this stop then leaves the tree alone."""
        child = self.child
        if self.slurm and self.stepping and allocation.stop_steps(self.job):
            deadline = time.time() + grace
            while child is not None and child.poll() is None and time.time() < deadline:
                time.sleep(0.1)
        with self.tree_lock:
            if child is None or child is self.ended_child:
                return
            procs = self.job_procs()
        processes.stop(procs, grace)

    def job_procs(self) -> List[processes.Proc]:
        """The job's process tree: every descendant of this supervisor (orphaned workers
        re-parent here) except the environment recorder's helper processes and the metrics
        watch's pattern worker (started before the job, so never seen before its pid is known)."""
        ours = self.watcher.helper_pids() if self.watcher is not None else set()
        if self.recorder is None:
            return [p for p in processes.descendants(os.getpid()) if p[0] not in ours]
        with self.recorder.helpers.lock:  # no helper starts between the two looks
            procs = processes.descendants(os.getpid())
            helpers = set(self.recorder.helpers.pids) | ours
        for pid in list(helpers):
            helpers.update(p for p, _ in processes.descendants(pid))
        return [p for p in procs if p[0] not in helpers]

    # -- steps -------------------------------------------------------------------------
    def env(self) -> Dict[str, str]:
        env = environment.job_environment(os.environ, self.job.get("env", {}), self.job_dir,
                                          int(self.status["attempt"]))
        env.update(self.node.get("env", {}))
        env["PYTHONUNBUFFERED"] = "1"
        if settings.metrics_from_log(env) and not any(k in env for k in RICH_TTY_KEYS):
            env.update(TTY_COMPATIBLE="1", TTY_INTERACTIVE="1")  # Rich's bars redraw into the log: docs/own-script.md
        env[settings.JOB_ID] = self.job["job_id"]
        env[settings.JOB_DIR] = self.job_dir
        env[settings.METRICS] = os.path.join(self.job_dir, "metrics.jsonl")  # docs/own-script.md
        payload = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # <root>/payload/<hash>
        env["PYTHONPATH"] = os.pathsep.join(p for p in (payload, env.get("PYTHONPATH", "")) if p)
        return env

    def run_step(self, argv: List[str], env: Dict[str, str], started: Optional[Callable[[], None]] = None,
                 cwd: Optional[str] = None) -> int:
        """Run argv in its own process group, in ``cwd`` (default the job's ``code/``), output
        appended to the node log; ``started`` is called once it runs. A program that cannot be
        started is the shell's 127 (not found) or 126, with a ``failure.CANNOT_START`` line in the
        log saying why."""
        if self.cancelled.is_set():
            return 143
        if self.warned.is_set():
            return WARNED_BEFORE_START
        if cwd is not None and not os.path.isdir(cwd):
            self.say("%s no folder %s on this node (launch.command's `cd %s &&`)"
                     % (failure.CANNOT_START, cwd, self.job.get("workdir")))
            return 127
        try:
            self.child = subprocess.Popen(
                argv, cwd=cwd or os.path.join(self.job_dir, "code"), env=env, stdin=subprocess.DEVNULL,
                stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        except OSError as exc:
            self.say("%s %s: %s" % (failure.CANNOT_START, type(exc).__name__, exc))
            return 127 if isinstance(exc, FileNotFoundError) else 126
        self.update(pgid=self.child.pid, child_pid=self.child.pid)
        if self.cancelled.is_set():
            self.on_sigterm(signal.SIGTERM, None)
        elif self.warned.is_set():  # the warning came while it was being started
            self._stop_at_warning()
        if started is not None:
            started()
        code = self.child.wait()
        with self.tree_lock:  # a stop that has not looked at the tree yet now leaves it to this line
            self.ended_child = self.child
        processes.stop(self.job_procs(), 5.0)  # nothing of the step outlives it
        return code

    def workdir(self, env: Dict[str, str]) -> str:
        """Where the job's command runs: its ``code/`` folder, or the plan's ``workdir`` (the
        command's leading ``cd DIR &&``: relative to ``code/``, absolute, or under ``~``)."""
        code = os.path.join(self.job_dir, "code")
        where = self.job.get("workdir")
        if not where:
            return code
        if where == "~" or where.startswith("~/"):
            where = env.get("HOME", os.path.expanduser("~")) + where[1:]
        return os.path.normpath(os.path.join(code, where))

    def setup(self, env: Dict[str, str]) -> int:
        script = self.job.get("setup")
        if not script:
            return 0
        key = hashlib.sha256(json.dumps([script, self.job.get("env", {})], sort_keys=True).encode()).hexdigest()[:16]
        marker = os.path.join(self.state_dir(), "setup-%s.done" % key)
        if os.path.exists(marker):
            self.say("setup unchanged since its last success on this host: skipped")
            return 0
        self.say("running setup")
        code = self.run_step(["bash", "-l", self.setup_file(script)], env)
        if code == 0:
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            open(marker, "w").close()
        return code

    def setup_file(self, script: str) -> str:
        """Write the setup script to ``<job_dir>/setup.sh`` and return its path: run from a
        file, a script of any size works (as ``bash -lc SCRIPT`` one over 128 KiB is refused by
        the kernel: "Argument list too long")."""
        path = os.path.join(self.job_dir, "setup.sh")
        with open(path, "w", encoding="utf-8") as f:
            f.write(script if script.endswith("\n") else script + "\n")
        return path

    def missing_modules(self, env: Dict[str, str]) -> List[str]:
        """For the built-in trainer: the packages it imports that this python lacks."""
        if not os.path.exists(os.path.join(self.job_dir, "train.json")):
            return []
        probe = "import importlib.util as u; print(' '.join(m for m in %r if u.find_spec(m) is None))" % (TRAINER_MODULES,)
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=False)
        return out.stdout.split()

    def finish(self, state: str, exit_code: Optional[int], reason: Optional[str]) -> None:
        """Give the GPUs back (``gpuqueue.release``), write the complete manifest, then the
        terminal state (under the job folder's flock). A full disk makes it ``failed`` (``_disk_full``)."""
        state, reason = self._disk_full(state, reason)
        self.say("job %s%s" % (state, ": " + reason if reason else ""))
        gpuqueue.release(self.job_dir, self.job["job_id"], self.node_rank)
        if self.node_rank == 0:  # before the end is written, so its line is in the log a follower reads
            webhook.notify(self.job, dict(self.status, state=state, exit_code=exit_code, reason=reason), self.say,
                           self.job_dir)
        manifest_path = os.path.join(self.job_dir, "manifest.json")
        cached = self.manifests.stop() if self.manifests is not None else None
        with Flock(self.job_dir):  # an earlier attempt's late refresh (onfinish.refresh_late) never crosses it
            for _ in range(2):  # again once the reserve is given up, when the disk was full
                try:
                    atomic_write_json(manifest_path, build_manifest(self.job_dir, cached or read_json(manifest_path)),
                                      compact=True)
                    self.manifest_written = file_key(manifest_path)
                    break
                except OSError as exc:
                    if not disk_full(exc):
                        state, reason = "failed", "cannot write manifest.json: %s" % exc
                        self.say(reason)
                        break
                    self.disk_full_at(manifest_path, exc)
                    if not self.reserve.release():
                        break
            ended = self._disk_full(state, reason)
            if ended != (state, reason):  # the manifest met the full disk
                state, reason = ended
                self.say("job %s: %s" % (state, reason))
            self.update(final=True, state=state, exit_code=exit_code, reason=self.end_reason(reason),
                        ended=time.time())
        self.heartbeat.stop()
        if self.budget is not None:
            self.budget.duty.stop()
        self.reserve.release()

    def end_reason(self, reason: Optional[str]) -> Optional[str]:
        """The end's reason with the ranks-alone note added; without either, the progress note."""
        said = [r for r in (reason, self.alone_note) if r]
        return "; ".join(said) if said else self.progress_note

    def _disk_full(self, state: str, reason: Optional[str]) -> "tuple[str, Optional[str]]":
        """``(state, reason)``, or ``failed`` with ``disk full: PATH: ...`` added when a write of
        orch's met a full disk during the job or its folder's disk is full now (a cancelled job
        stays cancelled)."""
        full = self.disk_error or full_at(self.job_dir)
        if full is None or state == "cancelled" or "disk full" in (reason or ""):
            return state, reason
        why = "disk full: %s" % full
        return "failed", ("%s; %s" % (reason, why) if state == "failed" and reason else why)

    def main(self) -> int:
        processes.become_subreaper()  # orphaned workers stay in this tree, so cancel reaches them
        signal.signal(signal.SIGTERM, self.on_sigterm)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if self.slurm:
            signal.signal(signal.SIGUSR1, self.on_warning)
        self.reserve.make()
        self.update()
        self.heartbeat.start()
        if self.budget is not None:
            self.budget.duty.start()
        environment.write_bash_env(self.job_dir)
        lacking = secrets.lacking(self.job, os.environ)
        if lacking:  # a supervisor not started by orch's helper (or a Slurm that dropped sbatch's environment)
            self.finish("failed", None, "the value of secret_env %s did not reach this node: run orch resume %s from "
                        "a laptop that has it set" % (", ".join(lacking), self.job["job_id"]))
            return 1
        env, refused = gpuqueue.take(self.job_dir, self.job, self.node_rank, self.env(), self.cancelled, self.update,
                                     self.say)  # waits as `queued` while the host's GPUs are taken
        code = 1 if refused else self.setup(env)
        reason = refused or "setup failed with exit code %d" % code
        if code == 0:
            missing = self.missing_modules(env)
            if missing:
                code, reason = 1, TRAINER_NEEDS % ", ".join(missing)
                self.say(reason)
        if code != 0 and not self.cancelled.is_set() and not self.warned.is_set():
            self.finish("failed", code, reason)
            onfinish.shutdown_when_done(self.job_dir, self.job, int(self.status["attempt"]), self.say)
            return 1
        if self.warned.is_set():  # the time-limit warning came before the job started: it does not start now
            code = code or WARNED_BEFORE_START
        elif not self.cancelled.is_set():
            self.update(state="running")
            if self.node.get("direct") and not self.node.get("plain"):  # plain: as `python x.py` would start it
                env = direct_env(env, free_port())
            argv = list(self.node["argv"])
            if int(self.status["attempt"]) > 1:
                argv = attempt.resume_argv(argv, list(self.job.get("resume_args") or []), self.job_dir, self.say,
                                           dropped=lambda why: self.update(resume_dropped=why))
            argv = launchers.complete(argv, self.job, self.node, env, self.job_dir)
            argv = allocation.step_argv(self.job, self.job_dir, argv) if self.slurm else argv
            self.say("starting: %s" % shlex.join(argv))
            watcher = self.watcher = metricswatch.watch(self.job_dir, self.node_rank, self.say, env,
                                                        self.note_progress_off)  # rows from the job's log lines
            several = int(self.node.get("nproc", 1)) > 1 or bool(self.node.get("plain"))
            joins = joinwatch.watch(self.job_dir, self.node_rank, self.say, self.note_ranks, several,
                                    self.note_alone)  # ranks never joined, or each alone
            self.stepping = True
            code = self.run_step(list(argv), env, started=self.start_background, cwd=self.workdir(env))
            joins.stop()
            watcher.stop()
        if self.recorder is None:  # the job never started: record what it would have run with
            self.recorder = self.new_recorder()
        late = self.budget.reached() if self.budget is not None and code not in (0, None) else None
        if late is not None and self.budget_reason is None and not self.cancelled.is_set():
            self.budget_reason = late  # another node's budget stop ended the job here before this one's check
            self.update(budget_reached=True)
        if self.budget_reason is not None:
            self.finish("cancelled", code, self.budget_reason)
        elif self.cancelled.is_set() and self.slurm and not allocation.cancel_requested(self.job_dir):
            state, why = allocation.ended_by_slurm(self.job)
            self.finish(state, code, why)
        elif self.cancelled.is_set():
            self.finish("cancelled", code, "cancelled by SIGTERM")
        elif code == 0:
            self.finish("succeeded", 0, None)
        elif self.warned.is_set():
            if self.job["slurm"]["resources"].get("requeue"):
                self.update(state="pending", exit_code=code, reason=allocation.warned_reason(self.job, True))
                leave, problem = allocation.requeue(self.job)
                if problem is None:
                    return leave  # Slurm ends this run of the batch script and starts the job again
                self.finish("failed", code, "%s; %s" % (allocation.warned_reason(self.job, False), problem))
            else:
                self.finish("failed", code, allocation.warned_reason(self.job, False))
        else:
            self.finish("failed", code, self.failure_reason(code))
        onfinish.after_end(self.job_dir, self.job, int(self.status["attempt"]), self.recorder, self.manifest_written,
                           self.say, spent=self.budget_reason is not None)  # the late record, then on_finish
        return 0

    def failure_reason(self, code: int) -> str:
        """The failure line from this node's log; in a Slurm allocation (every node's log is in
        this job folder) from the first node whose log explains more than the exit code."""
        nodes = range(len(self.job["nodes"])) if self.slurm else [self.node_rank]
        reasons = [failure.reason(self.job_dir, n, self.job["job_id"], code, direct=bool(self.node.get("direct")),
                                  plain=bool(self.node.get("plain")))
                   for n in nodes]
        return next((r for r in reasons if not r.startswith("job exited with code")), reasons[0])

    def new_recorder(self) -> repro.Recorder:
        """The environment record of this node, kept for the next job in ``<root>/state/environment``."""
        cache = os.path.join(self.state_dir(), "environment")
        return repro.Recorder(self.job_dir, sys.executable, RECORD_DELAY_S, cache)

    def state_dir(self) -> str:
        """This node's ``<root>/state/`` (the job folder is ``<root>/jobs/<id>``)."""
        return os.path.join(os.path.dirname(os.path.dirname(self.job_dir)), "state")

    def start_background(self) -> None:
        """Once the job runs: record the environment (after setup: what the job runs with) and
        keep a manifest of what it writes, both beside it."""
        self.recorder = self.new_recorder()
        self.manifests = ManifestCache(self.job_dir, float(self.job.get("heartbeat_s", 2.0)),
                                       read_json(os.path.join(self.job_dir, "manifest.json")), self.say)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--job-dir", required=True)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--secrets-on-stdin", action="store_true",
                        help="Read the values of the job's secret_env from stdin (helper/agent.py: spawn).")
    args = parser.parse_args(argv)
    testclock.shift_for_tests(os.path.dirname(os.path.dirname(os.path.abspath(args.job_dir))))
    os.umask(0o077)  # what the job writes is its owner's only (jobdir/private.py), in a Slurm allocation too
    if args.secrets_on_stdin:  # before anything else: in this process's environment, so every step inherits them
        os.environ.update(secrets.receive(sys.stdin.buffer))
    sup = Supervisor(os.path.abspath(args.job_dir), args.node_rank)
    try:
        return sup.main()
    except Exception as exc:  # the state must never stay "running" after a crash
        sup.say("supervisor error: %r" % (exc,))
        if disk_full(exc):
            sup.disk_full_at(getattr(exc, "filename", None) or sup.job_dir, exc)
        sup.finish("failed", None, "supervisor error: %s" % exc)
        raise


if __name__ == "__main__":
    sys.exit(main())

"""What is recorded about a job, for ``orch show`` and ``orch rerun`` (standard library only).

``repro/`` in a job folder: ``spec.yaml`` (as written), ``spec.resolved.json``, ``git.json``
and ``git.diff`` from the laptop at submit; ``environment.json`` (python, torch, CUDA, GPUs)
and ``pip-freeze.txt`` written by the supervisor on the node, while the job runs (``Recorder``);
a job shorter than the record reaches its terminal state first, and the record lands a moment
later (the supervisor refreshes ``manifest.json`` then).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from typing import Any, Dict, List, Optional, Set, Tuple

from remote_payload.contract.jobfolder import atomic_write_json, atomic_write_text, read_json

PROBE = (
    "import json, platform, sys\n"
    "out = {'python': sys.version.split()[0], 'executable': sys.executable, 'platform': platform.platform()}\n"
    "try:\n"
    "    import torch\n"
    "    out.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())\n"
    "except Exception as exc:\n"
    "    out['torch'] = 'unavailable: %s' % exc\n"
    "print(json.dumps(out))\n"
)


class Helpers:
    """The helper processes a record runs, while they run: ``pids``, changed under ``lock``
    (held from before a helper is started until its pid is in the set)."""

    def __init__(self) -> None:
        self.pids: Set[int] = set()
        self.lock = threading.Lock()


def _run(argv: List[str], timeout: float = 60, helpers: Optional[Helpers] = None) -> str:
    """``argv``'s stdout ('' when it cannot run or times out)."""
    helpers = helpers or Helpers()
    try:
        with helpers.lock:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, universal_newlines=True)
            helpers.pids.add(proc.pid)
    except OSError:
        return ""
    try:
        out, _ = proc.communicate(timeout=timeout)
        return out or ""
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return ""
    finally:
        with helpers.lock:
            helpers.pids.discard(proc.pid)


def record_environment(job_dir: str, python: str, helpers: Optional[Helpers] = None) -> None:
    """Write environment.json and pip-freeze.txt for this node (each atomically); the helper
    processes it runs are in ``helpers`` while they run."""
    repro = os.path.join(job_dir, "repro")
    os.makedirs(repro, exist_ok=True)
    env: Dict[str, Any] = {}
    try:
        env = json.loads(_run([python, "-c", PROBE], 60, helpers) or "{}")
    except ValueError:
        pass
    env["gpus"] = [line for line in _run(["nvidia-smi", "-L"], 20, helpers).splitlines() if line.startswith("GPU ")]
    freeze = _run([python, "-m", "pip", "freeze"], 120, helpers)
    atomic_write_text(os.path.join(repro, "pip-freeze.txt"), freeze)
    atomic_write_json(os.path.join(repro, "environment.json"), env)


RECORD_NICE = 10  # while the job runs: the record's helpers get a tenth of a core beside a busy process


class Recorder:
    """``record_environment`` in a background thread, started beside the job so it never sits
    between the job's end and its terminal state. It begins ``delay_s`` after it is made (the
    job's own start-up gets the CPU first) or at ``hurry()`` (the job ended), whichever is first.
    ``helpers`` are the processes it runs (the supervisor keeps them out of the job's process
    tree); ``wait`` joins it.

    Priority: a record that begins while the job runs (a Python that imports torch, then ``pip
    freeze``: seconds of CPU) runs at nice ``RECORD_NICE`` — its thread, and so the processes it
    starts (on Linux a child inherits the nice value of the thread that forked it) — so it yields
    to the job. Once the job ended (``hurry``), someone may be waiting for the record (a fetch,
    a move): the thread and its running helpers go back to the supervisor's priority where the
    system allows it (root may raise a priority again; another user's record finishes at nice
    ``RECORD_NICE``). A record that begins after the job ended runs at normal priority."""

    def __init__(self, job_dir: str, python: str, delay_s: float = 0.0) -> None:
        self.helpers = Helpers()
        self.error: Optional[BaseException] = None
        self.go = threading.Event()
        self._lowered: Optional[Tuple[int, int]] = None  # (thread id, the priority it had), while lowered
        self.thread = threading.Thread(target=self._run, args=(job_dir, python, delay_s), name="orch-repro",
                                       daemon=True)
        self.thread.start()

    def _run(self, job_dir: str, python: str, delay_s: float) -> None:
        if not self.go.wait(delay_s):  # the job still runs: the record yields to it
            self._lower()
        try:
            record_environment(job_dir, python, self.helpers)
        except Exception as exc:  # noqa: BLE001 - a record that cannot be written never fails the job
            self.error = exc

    def _lower(self) -> None:
        with self.helpers.lock:  # against hurry(): lowered before it, or not at all
            if self.go.is_set():
                return
            try:
                tid = threading.get_native_id()
                base = os.getpriority(os.PRIO_PROCESS, tid)
                if base < RECORD_NICE:
                    os.setpriority(os.PRIO_PROCESS, tid, RECORD_NICE)
                    self._lowered = (tid, base)
            except (AttributeError, OSError):  # not Linux, or not allowed: the record runs as it is
                pass

    def hurry(self) -> None:
        """Begin now if still waiting (the job ended); a record already running at low priority
        goes back to the supervisor's."""
        self.go.set()
        with self.helpers.lock:  # no helper starts meanwhile: each one is reniced here or forked after
            if self._lowered is None:
                return
            tid, base = self._lowered
            self._lowered = None
            for who in (tid, *self.helpers.pids):
                try:
                    os.setpriority(os.PRIO_PROCESS, who, base)
                except OSError:  # not allowed (not root), or the helper just ended
                    pass

    def done(self) -> bool:
        return not self.thread.is_alive()

    def wait(self) -> None:
        self.hurry()
        self.thread.join()


FROM_LAPTOP = ("spec.yaml", "spec.resolved.json", "git.json", "git.diff")


def write_submission(folder: str, repro: Dict[str, Any]) -> None:
    """The laptop's records of a submission: the spec as written and resolved, git state."""
    os.makedirs(folder, exist_ok=True)
    texts = {"spec.yaml": repro.get("spec_text"), "git.diff": repro.get("git_diff")}
    for name, text in texts.items():
        if isinstance(text, str):
            with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
                f.write(text)
    for name, key in (("spec.resolved.json", "spec_resolved"), ("git.json", "git")):
        if repro.get(key) is not None:
            atomic_write_json(os.path.join(folder, name), repro[key])


def show(job_dir: str) -> Dict[str, Any]:
    """What was recorded about a job: spec, git state, environment, pip freeze, the hosts it
    moved between."""
    repro = os.path.join(job_dir, "repro")

    def text(name: str, limit: int = 1 << 20) -> Optional[str]:
        try:
            with open(os.path.join(repro, name), encoding="utf-8", errors="replace") as f:
                return f.read(limit)
        except OSError:
            return None

    return {"spec_text": text("spec.yaml"), "git_diff": text("git.diff"),
            "spec_resolved": read_json(os.path.join(repro, "spec.resolved.json")),
            "git": read_json(os.path.join(repro, "git.json")),
            "environment": read_json(os.path.join(repro, "environment.json")),
            "pip_freeze": text("pip-freeze.txt"),
            "moves": read_json(os.path.join(job_dir, "moves.json")) or []}  # orch resume --on: movejob.HISTORY

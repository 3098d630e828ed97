"""What is recorded about a job, for ``orch show`` and ``orch rerun`` (standard library only).

``repro/`` in a job folder: ``spec.yaml`` (as written), ``spec.resolved.json``, ``git.json``
and ``git.diff`` from the laptop at submit; ``environment.json`` (python, torch, CUDA, GPUs)
and ``pip-freeze.txt`` written by the supervisor on the node, while the job runs (``Recorder``);
a job shorter than the record reaches its terminal state first, and the record lands a moment
later (the supervisor refreshes ``manifest.json`` then).

The probe imports torch and ``pip freeze`` reads every installed package: seconds of CPU per
job. Both answers depend only on the Python and what is installed where it imports from, so
they are kept under ``<root>/state/environment/`` keyed by a cheap stamp (``STAMP``: the
interpreter; each ``sys.path`` folder but the current one with its modification time —
installing, removing or upgrading a package changes its folder's; each editable install's
source folder with its ``.git``'s — a commit there changes the freeze's ``-e git+…@commit`` line)
and the variables in ``STAMP_ENV``; a job whose stamp matches copies them, and one that finds the
same environment being probed (by the job before it, submitted moments earlier) waits for that
record rather than probing beside it. ``nvidia-smi -L`` runs every time. Not kept: a record
whose stamp changed while it was made.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import threading
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

from remote_payload.contract.jobfolder import atomic_write_json, atomic_write_text, read_json
from remote_payload.jobdir.lease import flock_within

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


STAMP = """
import json, os, sys
def mtime(p):
    try:
        return os.stat(p).st_mtime_ns
    except OSError:
        return None
def editable(folder):
    out = []
    try:
        names = os.listdir(folder)
    except OSError:
        return out
    for name in names:
        try:
            if name.endswith(".dist-info"):
                with open(os.path.join(folder, name, "direct_url.json")) as f:
                    url = json.load(f)
                if (url.get("dir_info") or {}).get("editable") and url.get("url", "").startswith("file://"):
                    from urllib.parse import unquote
                    out.append(unquote(url["url"][len("file://"):]))
            elif name.endswith(".egg-link"):
                with open(os.path.join(folder, name)) as f:
                    out.append(f.readline().strip())
        except (OSError, ValueError, AttributeError):
            pass
    return out
paths = [p for p in sys.path if p]
sources = sorted(s for p in paths for s in editable(p))
print(json.dumps([sys.executable, sys.version, sys.prefix, [[p, mtime(p)] for p in paths],
                  [[s, mtime(os.path.join(s, ".git"))] for s in sources]]))
"""
STAMP_ENV = ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME")  # torch.cuda.is_available() reads them


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


def record_environment(job_dir: str, python: str, helpers: Optional[Helpers] = None,
                       cache: Optional[str] = None) -> None:
    """Write environment.json and pip-freeze.txt for this node (each atomically); the helper
    processes it runs are in ``helpers`` while they run. ``cache``: the folder of kept records
    (module docstring), or None to probe every time."""
    repro = os.path.join(job_dir, "repro")
    os.makedirs(repro, exist_ok=True)
    key = _stamp(python, helpers) if cache else None
    with _probing(cache, key):  # a record of this environment in progress (the job before) is waited for
        kept = _kept(cache, key)
        if kept is not None:
            env, freeze = kept
        else:
            env = {}
            try:
                env = json.loads(_run([python, "-c", PROBE], 60, helpers) or "{}")
            except ValueError:
                pass
            freeze = _run([python, "-m", "pip", "freeze"], 120, helpers)
            if cache and key and isinstance(env, dict) and env.get("python") and freeze.strip() \
                    and _stamp(python, helpers) == key:
                _keep(cache, key, env, freeze)
    if not isinstance(env, dict):
        env = {}
    env["gpus"] = [line for line in _run(["nvidia-smi", "-L"], 20, helpers).splitlines() if line.startswith("GPU ")]
    atomic_write_text(os.path.join(repro, "pip-freeze.txt"), freeze)
    atomic_write_json(os.path.join(repro, "environment.json"), env)


def _stamp(python: str, helpers: Optional[Helpers]) -> Optional[str]:
    """The key of ``python``'s environment as it is now (``STAMP``, ``STAMP_ENV``); None when
    it cannot tell."""
    out = _run([python, "-c", STAMP], 60, helpers)
    if not out.strip():
        return None
    data = json.dumps([out.strip(), [(k, os.environ.get(k)) for k in STAMP_ENV]])
    return hashlib.sha256(data.encode("utf-8", "surrogateescape")).hexdigest()[:32]


PROBING_WAIT_S = 200.0  # longer than one probe and freeze may run (_run's timeouts): then it probes anyway


@contextlib.contextmanager
def _probing(cache: Optional[str], key: Optional[str]) -> Iterator[None]:
    """Hold ``<cache>/<key>.lock`` (``flock``: the kernel lets go when its holder ends) while
    this environment is probed, so that jobs started back to back probe it once: the second
    waits for the first's record and copies it, instead of importing torch beside it. After
    ``PROBING_WAIT_S`` it goes on without the lock; without a cache or a key there is nothing to
    share."""
    if not cache or not key:
        yield
        return
    try:
        os.makedirs(cache, exist_ok=True)
        handle = open(os.path.join(cache, key + ".lock"), "a")
    except OSError:  # a read-only or full state folder: probe alone
        yield
        return
    with handle:
        flock_within(handle, PROBING_WAIT_S, 0.2)  # held or not, the probe goes on
        yield  # closing the handle lets go of the lock


def _kept(cache: Optional[str], key: Optional[str]) -> Optional[Tuple[Dict[str, Any], str]]:
    """The kept (environment, freeze) for ``key``, or None (none kept, or not readable as one)."""
    if not cache or not key:
        return None
    data = read_json(os.path.join(cache, key + ".json"))
    if not isinstance(data, dict) or not isinstance(data.get("environment"), dict) \
            or not isinstance(data.get("pip_freeze"), str):
        return None
    return dict(data["environment"]), data["pip_freeze"]


def _keep(cache: str, key: str, env: Dict[str, Any], freeze: str) -> None:
    try:
        os.makedirs(cache, exist_ok=True)
        atomic_write_json(os.path.join(cache, key + ".json"), {"environment": env, "pip_freeze": freeze})
    except OSError:  # a full disk, a read-only state folder: the next job probes again
        pass


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

    def __init__(self, job_dir: str, python: str, delay_s: float = 0.0, cache: Optional[str] = None) -> None:
        self.helpers = Helpers()
        self.error: Optional[BaseException] = None
        self.go = threading.Event()
        self._lowered: Optional[Tuple[int, int]] = None  # (thread id, the priority it had), while lowered
        self.thread = threading.Thread(target=self._run, args=(job_dir, python, delay_s, cache), name="orch-repro",
                                       daemon=True)
        self.thread.start()

    def _run(self, job_dir: str, python: str, delay_s: float, cache: Optional[str]) -> None:
        if not self.go.wait(delay_s):  # the job still runs: the record yields to it
            self._lower()
        try:
            record_environment(job_dir, python, self.helpers, cache)
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
    moved between, and the built-in trainer's data mixture (sources, drawn, trained on) when it has one."""
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
            "moves": read_json(os.path.join(job_dir, "moves.json")) or [],  # orch resume --on: movejob.HISTORY
            "mix": read_json(os.path.join(job_dir, "mix.json"))}  # the built-in trainer's data.mix (trainer/mixture.py)

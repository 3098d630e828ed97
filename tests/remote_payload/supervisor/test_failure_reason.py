"""A failed job says why in one line (remote_payload/supervisor/failure.py): the failing rank and node,
its last exception line or error line or signal, the worker's exit code, and where the full
log is — in `orch status`, at the end of `orch logs -f`, and in `submit --follow --json`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from remote_payload.supervisor import failure
from tests.support.orch import Orch, write_job
from tests.support.sshd import free_port

SCRIPTS = {
    "boom.py": "def load():\n    raise ValueError('boom')\n\nprint('starting', flush=True)\nload()\n",
    "opens.py": "open('train.py')\n",
    "kill9.py": "import os, signal\nprint('about to die', flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n",
    "quiet.py": "import sys\nprint('step 5 done', flush=True)\nsys.exit(3)\n",
    "evil.py": "raise RuntimeError('bad\\x1b]0;title\\x07 \\x1b[31mred\\r\\nsecond line')\n",
    "torchrunstyle.py": "import os\nlocal_rank = int(os.environ['LOCAL_RANK'])\n",  # the DDP tutorial's first line
}
DDP = ("import torch.distributed as dist\ndist.init_process_group('gloo')\n"
       "if dist.get_rank() == 1:\n    raise RuntimeError('rank one broke')\ndist.barrier()\n")

# job name -> (command, what the reason must hold after "rank R on node 0: " / as a whole)
CASES = {
    "raises": (["python", "boom.py"], "rank 0 on node 0: ValueError: boom (exit code 1)"),
    "opens": (["python", "opens.py"],
              "rank 0 on node 0: FileNotFoundError: [Errno 2] No such file or directory: 'train.py' (exit code 1)"),
    "missing": (["python", "missing.py"], "can't open file 'missing.py': [Errno 2] No such file or directory (exit code 2)"),
    "notfound": (["bash", "-c", "echo hi; no-such-cmd-xyz --flag"], "no-such-cmd-xyz: command not found (exit code 127)"),
    "killed": (["python", "kill9.py"], "rank 0 on node 0: killed by signal 9 (SIGKILL, out of memory?)"),
    "quiet": (["python", "quiet.py"], "rank 0 on node 0 exited with code 3"),
    "nobinary": (["no-such-binary-xyz"],  # started directly (one process): the supervisor's exec fails
                 "rank 0 on node 0: FileNotFoundError: [Errno 2] No such file or directory: 'no-such-binary-xyz' "
                 "(exit code 127)"),
    "nobinary-torchrun": (["no-such-binary-xyz"],
                          "torchrun: FileNotFoundError: [Errno 2] No such file or directory: 'no-such-binary-xyz' "
                          "(exit code 1)"),
    "evil": (["python", "evil.py"], "rank 0 on node 0: RuntimeError: bad"),
    # a torchrun-style script started as plain python (one process, launcher: auto): told how to get torchrun's variables
    "plain": (["python", "torchrunstyle.py"], "rank 0 on node 0: KeyError: 'LOCAL_RANK' (exit code 1); started as "
              "plain python, without torchrun's variables: write torchrun in launch.command or set launch.launcher: "
              "direct"),
    # one process: accelerate runs the script as its child and raises CalledProcessError naming it
    "accelerate": (["accelerate", "launch", "--num_processes", "1", "--cpu", "boom.py"],
                   "rank 0 on node 0: ValueError: boom (exit code 1)"),
}


# `orch submit` refuses `python missing.py` on the laptop, unless the job's setup mentions the
# file (setup may make it): this one's does not, so the file is missing on the server.
EXTRA = {"missing": "setup: 'echo missing.py is made by nobody'\n", "nobinary-torchrun": "  launcher: torchrun\n"}


def submit_all(orch: Orch, host: str, cases: dict[str, tuple[list[str], str]]) -> dict[str, str]:
    """Submit every case at once (one workspace holding every script); name -> job id."""
    jobs = {}
    for name, (command, _) in cases.items():
        spec = write_job(orch.cwd, name, host, command, EXTRA.get(name, ""))
        for script, text in SCRIPTS.items():
            (orch.cwd / "ws" / script).write_text(text)
        jobs[name] = orch.json("submit", str(spec))["job_id"]
    return jobs


def assert_one_clean_line(reason: str) -> None:
    assert "\n" not in reason and "\r" not in reason and "\x1b" not in reason and "\x07" not in reason
    assert len(reason) < 600


def test_failure_reasons_in_status_and_at_the_end_of_the_log(orch: Orch, host: str) -> None:
    """Every case on `local`; over SSH the four the issue names (the parsing is the same)."""
    ssh_cases = ("raises", "missing", "notfound", "killed")
    jobs = submit_all(orch, host, CASES if host == "local" else {k: CASES[k] for k in ssh_cases})
    for name, job in jobs.items():
        expected = CASES[name][1]
        status = orch.wait_state(job, ("succeeded", "failed", "lost", "cancelled"), timeout=180)
        reason = status["reason"]
        assert status["state"] == "failed", (name, status)
        assert expected in reason and reason.endswith(f"; full log: orch logs {job}"), (name, reason)
        assert_one_clean_line(reason)
        assert "Traceback" not in reason and "ChildFailedError" not in reason
        if name in ("missing", "notfound"):
            assert reason.startswith("rank 0 on node 0: "), reason

        followed = orch("logs", job, "-f", check=None)
        assert followed.returncode == 0
        assert followed.stderr.rstrip("\n").splitlines()[-1] == f"orch: {job} failed: {reason}"
        assert followed.stdout.rstrip("\n").splitlines()[-1] == f"[orch] job failed: {status['reason']}"

    if "evil" in jobs:
        evil = orch.json("status", jobs["evil"])["reason"]
        assert "red" in evil and "second line" not in evil  # the exception's first line only, escapes gone


def test_submit_follow_json_carries_the_reason(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "boom", host, ["python", "boom.py"])
    (orch.cwd / "ws" / "boom.py").write_text(SCRIPTS["boom.py"])
    done = orch("submit", str(spec), "--follow", "--json", check=1)
    result = json.loads(done.stdout)
    assert result["state"] == "failed" and result["exit_code"] == 1
    assert result["reason"] == f"rank 0 on node 0: ValueError: boom (exit code 1); full log: orch logs {result['job_id']}"
    # --json streams the log on stderr: the supervisor's line there says it, the laptop does not repeat it
    assert done.stderr.rstrip("\n").splitlines()[-1] == f"[orch] job failed: {result['reason']}"
    assert f"orch: {result['job_id']} failed" not in done.stderr


def test_the_failing_rank_of_two_is_named(orch: Orch) -> None:
    """Two workers: rank 1 raises, rank 0 then fails in a collective. torchrun's summary
    names rank 1, and the reason is rank 1's exception (torch prefixes it `[rank1]:`), not
    rank 0's later 'Connection closed by peer'."""
    spec = write_job(orch.cwd, "ddp", "local", ["python", "ddp.py"])
    spec.write_text(spec.read_text().replace("nproc_per_node: 1", "nproc_per_node: 2"))
    (orch.cwd / "ws" / "ddp.py").write_text(DDP)
    job = orch.json("submit", str(spec))["job_id"]
    status = orch.wait_state(job, ("succeeded", "failed", "lost"), timeout=180)
    assert status["state"] == "failed"
    assert status["reason"] == f"rank 1 on node 0: RuntimeError: rank one broke (exit code 1); full log: orch logs {job}"


def test_explain_reads_an_error_file_and_exit_codes_over_128(tmp_path: Path) -> None:
    """The parts torchrun writes only in other set-ups: an @record error file, and a shell
    reporting its killed child as 137."""
    error_file = tmp_path / "error.json"
    error_file.write_text(json.dumps({"message": {"message": "KeyError: 'labels'", "extraInfo": {"py_callstack": "x"}}}))
    summary = ("Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-30_18:21:06\n  host      : box\n"
               f"  rank      : 3 (local_rank: 1)\n  exitcode  : 1 (pid: 11445)\n  error_file: {error_file}\n"
               "  traceback : ...\n======\n")
    noticed = "E1130 api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 11445) of binary: python\n"
    assert failure.explain("[orch] starting: x\n" + noticed + summary, 1, 1) == \
        "rank 3 on node 1: KeyError: 'labels' (exit code 1)"
    shell = summary.replace(str(error_file), "<N/A>").replace("exitcode  : 1", "exitcode  : 137")
    assert failure.explain("training\n" + noticed + shell, 1, 1) == \
        "rank 3 on node 1 exited with code 137 (128+9: SIGKILL, out of memory?)"


def test_a_launcher_that_runs_the_script_as_its_child_gives_the_scripts_own_reason(tmp_path: Path) -> None:
    """The launchers that report a failed child their own way, run for real on failing
    scripts: `accelerate launch` with one process (a CalledProcessError naming the command,
    its cause repeating the script's stderr) and deepspeed's launcher (`... exits with return
    code = 1`). The reason is the script's: its exception, its exit code, its signal — also
    when a bash wrapper started the launcher (a direct start) — never the wrapper's."""
    for name, text in SCRIPTS.items():
        (tmp_path / name).write_text(text)
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--cpu"]
    deepspeed = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "1", "--master_port",
                 str(free_port())]
    runs = {"acc-raises": accelerate + ["boom.py"], "acc-quiet": accelerate + ["quiet.py"],
            "acc-killed": accelerate + ["kill9.py"], "ds-raises": deepspeed + ["boom.py"]}
    procs = {name: subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name, argv in runs.items()}
    logs = {name: "[orch] starting: x\n" + p.communicate(timeout=300)[0] for name, p in procs.items()}
    assert all(p.returncode != 0 for p in procs.values()), logs
    assert "CalledProcessError: Command" in logs["acc-raises"] and "exits with return code = 1" in logs["ds-raises"]
    expected = {"acc-raises": "rank 0 on node 0: ValueError: boom (exit code 1)",
                "acc-quiet": "rank 0 on node 0 exited with code 3",
                "acc-killed": "rank 0 on node 0: killed by signal 9 (SIGKILL, out of memory?)",
                "ds-raises": "rank 0 on node 0: ValueError: boom (exit code 1)"}
    for name, log in logs.items():
        launcher = name.split("-")[0].replace("acc", "accelerate").replace("ds", "deepspeed")
        assert failure.explain(log, 0, 1, launcher, nproc=1) == expected[name], (name, log[-3000:])
    # a bash wrapper of accelerate (a direct start): the script's exception; the launcher's own failure: its name
    assert failure.explain_direct(logs["acc-raises"], 0, 1) == "rank 0 on node 0: ValueError: boom (exit code 1)"
    own = "[orch] starting: x\nTraceback (most recent call last):\n  File \"x\", line 1\nOSError: bad config\n"
    assert failure.explain(own, 0, 1, "accelerate", nproc=1) == "accelerate: OSError: bad config (exit code 1)"


# torchrun's own report of a DDP-on-gloo rank that aborted at interpreter exit (torch 2.13,
# pytorch/pytorch#190489), as it appeared in a node log (pids and times as they were).
TEARDOWN_ABORT = """\
[orch] starting: python -m torch.distributed.run --standalone --nnodes 1 --nproc_per_node 2 ddp.py
terminate called without an active exception
W1205 11:42:11.260000 17644 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 17710 closing \
signal SIGTERM
E1205 11:42:11.284000 17644 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -6) \
local_rank: 1 (pid: 17711) of binary: python
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
=======================================================
ddp.py FAILED
-------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-05_11:42:11
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 17711)  (SIGABRT)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 17711
=======================================================
"""


def test_an_abort_at_exit_after_terminate_names_torchs_gloo_teardown_race() -> None:
    """A SIGABRT after the C++ runtime's 'terminate called without an active exception' names
    the likely cause; a SIGABRT without that line, or another signal after it, does not."""
    said = failure.explain(TEARDOWN_ABORT, 0, 1)
    assert said == ("rank 1 on node 0: killed by signal 6 (SIGABRT) after 'terminate called without an active "
                    "exception' (at exit, with gloo: PyTorch's teardown race, pytorch/pytorch#190489)")
    plain = TEARDOWN_ABORT.replace("terminate called without an active exception\n", "")
    assert failure.explain(plain, 0, 1) == "rank 1 on node 0: killed by signal 6 (SIGABRT)"
    killed = TEARDOWN_ABORT.replace("exitcode: -6", "exitcode: -9").replace("exitcode  : -6", "exitcode  : -9")
    assert failure.explain(killed, 0, 1) == "rank 1 on node 0: killed by signal 9 (SIGKILL, out of memory?)"
    assert failure.explain_direct("terminate called without an active exception\n", 0, -6).endswith(
        "(at exit, with gloo: PyTorch's teardown race, pytorch/pytorch#190489)")

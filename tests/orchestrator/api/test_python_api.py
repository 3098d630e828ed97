"""The Python API (orchestrator/api): docs/python-api.md's example run as written, its results
equal to the CLI's ``--json``, its failures the CLI's errors, and nothing of click or rich
loaded by importing it. The API runs in a subprocess with the test's own ``ORCH_HOME`` (the
``orch`` fixture), against the built-in ``local`` host and the loopback sshd."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.orch import REPO, Orch, dead_port

DOC = REPO / "docs" / "python-api.md"


def doc_blocks() -> dict[str, str]:
    """The page's python blocks by the file their first line names (``# train.py``)."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    return {block.splitlines()[0].lstrip("# ").strip(): block for block in blocks}


def run_python(orch: Orch, code: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=orch.cwd, env=orch.env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_docs_example_submits_follows_waits_fetches_and_plots_a_job_on_local(orch: Orch) -> None:
    blocks = doc_blocks()
    assert set(blocks) == {"train.py", "notebook.py"}
    (orch.cwd / "train.py").write_text(blocks["train.py"])
    done = run_python(orch, blocks["notebook.py"])
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    job_id = out[0].split()[1]
    assert out[0] == f"submitted {job_id}"
    assert "iter 20: loss 0.2463, time 10.00ms" in out  # the log, line by line, followed to its end
    assert "succeeded 0.2463" in out
    assert (orch.cwd / "runs" / job_id / "outputs" / "model.txt").read_text() == "weights\n"
    assert (orch.cwd / "loss.png").stat().st_size > 1000
    cli = orch.json("status", job_id)
    api = run_python(orch, f"import json, orchestrator.api as o; print(json.dumps(o.status({job_id!r}).as_json()))")
    assert json.loads(api.stdout) == cli  # the same object the CLI prints
    again = run_python(orch, f"import orchestrator.api as o; r = o.fetch({job_id!r}); print(len(r.fetched), "
                             "len(r.unchanged))")
    first = next(line for line in out if line.endswith("file(s) fetched")).split()[1]
    assert int(first) >= 2 and again.stdout.split() == ["0", first]  # idempotent: all verified here already


def test_importing_the_api_loads_neither_click_nor_rich(orch: Orch) -> None:
    done = run_python(orch, "import sys, orchestrator.api; print(sorted(m for m in ('click', 'rich') if m in sys.modules))")
    assert done.stdout.strip() == "[]", done.stderr


def test_failures_raise_the_errors_the_cli_prints_with_their_messages(orch: Orch) -> None:
    orch("hosts", "add", "gone", "--ssh", f"ssh -p {dead_port()} root@127.0.0.1")
    (orch.cwd / "ws").mkdir()
    (orch.cwd / "ws" / "x.py").write_text("print(1)\n")
    (orch.cwd / "job.yaml").write_text("name: lost\nhosts: [gone]\nworkspace: {path: ws}\n"
                                       "launch: {nproc_per_node: 1, command: [python, x.py]}\n")
    (orch.cwd / "bad.yaml").write_text("name: bad\nhosts: [local]\nlaunch: {nproc_per_node: zero}\n")
    code = textwrap.dedent("""
        import orchestrator.api as o
        for call in (lambda: o.status("no-such-job"), lambda: o.submit("bad.yaml"), lambda: o.submit("job.yaml")):
            try:
                call()
            except o.OrchError as exc:
                print(type(exc).__name__, exc.exit_code, str(exc).splitlines()[0])
        """)
    lines = run_python(orch, code).stdout.splitlines()
    cli = [orch("status", "no-such-job", check=2).stderr, orch("check", "bad.yaml", check=2).stderr,
           orch("submit", "job.yaml", check=3).stderr]
    assert [line.split()[:2] for line in lines] == [["UsageError", "2"], ["SpecError", "2"], ["HostError", "3"]]
    for line, printed in zip(lines, cli):
        message = line.split(" ", 2)[2]
        assert message in printed, (message, printed)
    assert "bad.yaml:3" in lines[1] and "nproc_per_node" in lines[1]


def test_a_sweep_through_the_api_is_a_list_of_jobs_on_the_pool(orch: Orch, box: str) -> None:
    (orch.cwd / "ws").mkdir()
    (orch.cwd / "ws" / "x.py").write_text("import os; print('X', os.environ['X'])\n")
    code = textwrap.dedent(f"""
        import json, orchestrator.api as o
        job = {{"name": "sw", "hosts": ["local", {box!r}], "workspace": {{"path": "ws"}},
               "launch": {{"nproc_per_node": 1, "command": ["python", "x.py"]}}}}
        jobs = o.submit(job, sweep={{"env.X": ["a", "b", "c"]}}, sweep_name="api-sweep")
        ended = [o.wait(j, timeout=300) for j in jobs]
        print(json.dumps([[j.combination, j.hosts[0], dict(j.values), s.state] for j, s in zip(jobs, ended)]))
        print(json.dumps([list(o.logs(j)) for j in jobs]))
        """)
    done = run_python(orch, code)
    assert done.returncode == 0, done.stderr
    jobs, logs = (json.loads(line) for line in done.stdout.splitlines())
    assert jobs == [[1, "local", {"env.X": "a"}, "succeeded"], [2, box, {"env.X": "b"}, "succeeded"],
                    [3, "local", {"env.X": "c"}, "succeeded"]]
    assert [[line for line in log if line.startswith("X ")] for log in logs] == [["X a"], ["X b"], ["X c"]]
    assert orch("status", "--sweep", "api-sweep").stdout.splitlines()[-1] == "3 combinations: 3 succeeded"


def test_hosts_puts_a_lone_job_on_other_hosts_and_its_recorded_file_says_so(orch: Orch, box: str) -> None:
    (orch.cwd / "ws").mkdir()
    (orch.cwd / "ws" / "x.py").write_text("print('ran here')\n")
    (orch.cwd / "job.yaml").write_text("name: moved\nhosts: [local]\nworkspace: {path: ws}\n"
                                       "launch: {nproc_per_node: 1, command: [python, x.py]}\n")
    code = textwrap.dedent(f"""
        import orchestrator.api as o
        job = o.submit("job.yaml", hosts=[{box!r}])
        print(job.job_id, job.hosts[0], o.wait(job, timeout=300).state)
        """)
    done = run_python(orch, code)
    assert done.returncode == 0, done.stderr
    job_id, host, state = done.stdout.split()
    assert (host, state) == (box, "succeeded")
    assert orch.json("status", job_id)["hosts"] == [box]
    shown = orch("show", job_id).stdout
    assert "# submitted through orchestrator.api with hosts=['box']" in shown

"""A user's own script writes where scripts write (relative to its working directory),
and `orch fetch` brings that back; what orch writes into a workspace never goes back up."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.fetch.manifest import Entry, local_names
from tests.support.orch import Orch, write_job

TUTORIAL = """\
import os, pathlib
os.makedirs("outputs/final", exist_ok=True)                       # the way tutorials write
pathlib.Path("outputs/final/model.bin").write_bytes(b"m" * 4096)
os.makedirs("ckpt", exist_ok=True)
pathlib.Path("ckpt/x.pt").write_bytes(b"c" * 100)
pathlib.Path("results.json").write_text('{"acc": 1}')             # not selected by outputs
job = pathlib.Path(os.environ["ORCH_JOB_DIR"]) / "outputs"        # the documented place still works
job.mkdir(exist_ok=True)
(job / "direct.txt").write_text(os.environ["ORCH_JOB_ID"])
"""


def submit(orch: Orch, spec: Path, *extra: str) -> str:
    return json.loads(orch("submit", str(spec), "--follow", "--json", *extra).stdout)["job_id"]


def test_outputs_written_relative_to_the_working_directory_are_fetched(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "rel", host, ["python", "train.py"], extra="outputs: [outputs/, ckpt/]\n")
    (orch.cwd / "ws" / "train.py").write_text(TUTORIAL)
    (orch.cwd / "ws" / "data.txt").write_bytes(b"d" * 5000)
    job = submit(orch, spec)
    out = orch("fetch", job)
    run = orch.cwd / "runs" / job
    assert (run / "outputs" / "final" / "model.bin").read_bytes() == b"m" * 4096
    assert (run / "ckpt" / "x.pt").stat().st_size == 100
    assert (run / "outputs" / "direct.txt").read_text() == job
    assert "3 fetched" in out.stdout
    files = sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file())
    assert files == [".orch-run", "ckpt/x.pt", "outputs/direct.txt", "outputs/final/model.bin"]  # no source files
    assert "0 fetched" in orch("fetch", job).stdout  # idempotent


def test_a_fetch_that_selects_nothing_says_what_the_job_folder_holds(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "none", host, ["python", "train.py"], extra="outputs: [model/]\n")
    (orch.cwd / "ws" / "train.py").write_text(
        "import os\nos.makedirs('results', exist_ok=True)\nopen('results/a.txt', 'w').write('a')\n")
    job = submit(orch, spec)
    out = orch("fetch", job, check=2)
    assert "nothing to fetch: the job's outputs patterns (model/) select no file" in out.stderr
    assert "results/ (1 file(s), 0.0 MB) (written by the job in its working directory)" in out.stderr
    assert f"orch fetch {job} --include results/" in out.stderr
    assert "logs/" in out.stderr and "Traceback" not in out.stderr
    orch("fetch", job, "--include", "results/")
    assert (orch.cwd / "runs" / job / "results" / "a.txt").read_text() == "a"


def test_fetched_runs_are_never_synced_back_but_a_users_own_runs_folder_is(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "loop", host, ["python", "train.py"])
    ws = orch.cwd / "ws"
    (ws / "train.py").write_text(TUTORIAL)
    first = submit(orch, spec)
    orch("fetch", first, "--dest", str(ws / "runs"))  # the default `runs/` when run from the project
    (ws / "runs" / "tensorboard").mkdir()
    (ws / "runs" / "tensorboard" / "events.out").write_text("mine")  # TensorBoard's default folder: synced
    dry = orch("submit", str(spec), "--dry-run")
    assert f"never synced (written by orch fetch/plot): runs/{first}/" in dry.stderr
    second = submit(orch, spec)
    code = orch.job_dir(second) / "code"
    assert (code / "runs" / "tensorboard" / "events.out").read_text() == "mine"
    assert not (code / "runs" / first).exists()


def test_a_rerun_starts_from_the_shipped_code_not_from_what_the_first_run_wrote(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "again", host, ["python", "train.py"])
    (orch.cwd / "ws" / "train.py").write_text(
        "import os\nassert not os.path.exists('outputs'), 'stale outputs in the working directory'\n"
        "os.makedirs('outputs')\nopen('outputs/id.txt', 'w').write(os.environ['ORCH_JOB_ID'])\n")
    first = submit(orch, spec)
    second = json.loads(orch("rerun", first, "--follow", "--json").stdout)["job_id"]
    orch("fetch", second)
    assert (orch.cwd / "runs" / second / "outputs" / "id.txt").read_text() == second


def test_a_working_directory_file_that_clashes_with_the_job_folder_keeps_its_code_prefix() -> None:
    entries = [Entry("outputs/a", 1, "0" * 64), Entry("code/outputs/a", 1, "1" * 64),
               Entry("code/outputs/b", 1, "2" * 64), Entry("metrics.jsonl", 1, "3" * 64),
               Entry("code/metrics.jsonl/x", 1, "4" * 64), Entry("code/outputs/a/deeper", 1, "5" * 64)]
    assert [e.local for e in local_names(entries)] == [
        "outputs/a", "code/outputs/a", "outputs/b", "metrics.jsonl", "code/metrics.jsonl/x", "code/outputs/a/deeper"]


def test_two_checkouts_with_the_same_folder_name_never_share_a_server_folder(orch: Orch, host: str) -> None:
    specs = []
    for laptop in ("alice", "bob"):
        checkout = orch.cwd / laptop / "train"
        checkout.mkdir(parents=True)
        (checkout / "main.py").write_text(f"print('code of {laptop}')\n")
        spec = checkout / "job.yaml"
        spec.write_text(f"name: {laptop}\nhosts: [{host}]\nlaunch: {{nproc_per_node: 1, command: python main.py}}\n")
        specs.append(spec)
    jobs = [submit(orch, spec) for spec in specs]
    for laptop, job in zip(("alice", "bob"), jobs):
        assert f"code of {laptop}" in orch("logs", job).stdout
    root = orch.job_dir(jobs[0]).parent.parent
    folders = {orch.server_workspace(spec.parent, root) for spec in specs}
    assert len(folders) == 2 and all(f.name.startswith("train-") and (f / "main.py").is_file() for f in folders)
    again = orch("submit", str(specs[0]), "--follow")
    assert "syncing 0 changed file(s)" in again.stderr and "deleting" not in again.stderr
    check = orch("hosts", "check", host, check=None).stdout  # a verdict per line; exit 4 on a blocker (no torch?)
    rows = [line for line in check.splitlines() if line.startswith("workspace ")]
    for spec in specs:
        folder = orch.server_workspace(spec.parent, root).name
        assert any(folder in row and f":{spec.parent}," in row for row in rows), check

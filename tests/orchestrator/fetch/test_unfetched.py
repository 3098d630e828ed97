"""`orch fetch` names what the job wrote that no pattern selected (a forgotten `outputs:`),
with the `--include` that brings it, and never the synced code or orch's own records."""

from __future__ import annotations

import json
import shlex

from orchestrator.fetch.manifest import Entry
from orchestrator.fetch.unfetched import Unfetched, lines, pattern_for, size_text, unfetched
from orchestrator.globs.match import Patterns
from tests.support.orch import Orch, write_job

SCRIPT = """\
import os, pathlib
pathlib.Path("model.pth").write_bytes(b"w" * 300_000)              # beside the script: the classic loss
os.makedirs("outputs", exist_ok=True)
pathlib.Path("outputs/ok.txt").write_text("ok")
os.makedirs("samples", exist_ok=True)
for i in range(3):
    pathlib.Path(f"samples/{i}.png").write_bytes(b"p" * 2000)
with open("notes.txt", "a") as f:                                  # a shipped file the job changed
    f.write("seen by the job\\n")
(pathlib.Path(os.environ["ORCH_JOB_DIR"]) / "extra.bin").write_bytes(b"e" * 5000)
"""


def test_fetch_names_what_the_job_wrote_that_no_pattern_selected(orch: Orch) -> None:
    spec = write_job(orch.cwd, "forgot", "local", ["python", "train.py"])  # no outputs: the default patterns
    ws = orch.cwd / "ws"
    (ws / "train.py").write_text(SCRIPT)
    (ws / "notes.txt").write_text("shipped\n")
    (ws / "data.txt").write_bytes(b"d" * 400_000)  # synced code, bigger than the model: never named
    job = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]

    out = orch("fetch", job)  # exit 0: it did fetch something
    run = orch.cwd / "runs" / job
    assert (run / "outputs" / "ok.txt").read_text() == "ok" and not (run / "model.pth").exists()
    said = [line.removeprefix("orch: ") for line in out.stderr.splitlines()]
    start = said.index("not fetched: 6 files the job wrote, 303.7 KB; no outputs pattern selects them:")
    assert said[start + 1:start + 5] == ["  model.pth  293.0 KB", "  samples/   5.9 KB (3 files)",
                                         "  extra.bin  4.9 KB", "  notes.txt  24 B"], out.stderr
    command = f"orch fetch {job} --include model.pth --include samples/ --include extra.bin --include notes.txt"
    assert said[start + 5] == f"to fetch them: {command}", out.stderr
    assert "data.txt" not in out.stderr and "train.py" not in out.stderr and "repro" not in out.stderr
    assert "1 fetched" not in out.stdout and " fetched (" in out.stdout

    data = orch.json("fetch", job)["not_fetched"]
    assert data[0] == {"name": "model.pth", "files": 1, "bytes": 300_000, "include": "model.pth"}
    assert [d["name"] for d in data] == ["model.pth", "samples/", "extra.bin", "notes.txt"]

    orch(*shlex.split(command)[1:])  # the line as printed brings them
    assert (run / "model.pth").stat().st_size == 300_000 and len(list((run / "samples").iterdir())) == 3
    assert (run / "notes.txt").read_text() == "shipped\nseen by the job\n"
    again = orch("fetch", job)
    assert "not fetched" not in again.stderr and ": 0 fetched (0.0 MB)" in again.stdout  # here already: not named


def test_the_named_items_are_the_jobs_own_biggest_first_with_patterns_that_match_only_them() -> None:
    entries = [Entry("code/model.pth", 300, "0" * 64), Entry("repro/pip-freeze.txt", 9000, "1" * 64),
               Entry("train.json", 9000, "2" * 64), Entry(".fetched", 1, "3" * 64),
               Entry("checkpoints/step-2/model.safetensors", 1000, "4" * 64),
               Entry("checkpoints/step-2/COMPLETE", 0, "5" * 64), Entry("code/res/only.json", 50, "6" * 64),
               Entry("code/w*[1].bin", 10, "7" * 64), Entry("code/#odd", 20, "8" * 64),
               Entry("code/model.pth", 300, "0" * 64)]  # another node's copy of the same file
    named = [Entry(e.path, e.size, e.sha256, e.path.removeprefix("code/")) for e in entries]
    items = unfetched(named)
    assert items == [Unfetched("checkpoints/", 2, 1000, "checkpoints/"), Unfetched("model.pth", 1, 300, "model.pth"),
                     Unfetched("res/only.json", 1, 50, "res/only.json"), Unfetched("#odd", 1, 20, "\\#odd"),
                     Unfetched("w*[1].bin", 1, 10, "w\\*\\[1\\].bin")]
    for item in items:
        spec = Patterns([item.pattern])  # the matcher orch fetch uses
        assert spec.match(item.name.rstrip("/") + ("/x" if item.name.endswith("/") else ""))
    assert not Patterns([pattern_for("w*[1].bin")]).match("wx1.bin")
    assert unfetched(named, here={"model.pth"})[1].name == "res/only.json"  # fetched earlier: not named
    assert unfetched([]) == [] and lines([], "j") == []

    many = [Unfetched(f"f{i}", 1, 2**20 * (10 - i), f"f{i}") for i in range(8)]
    text = lines(many, "job-1")
    assert text[0] == "not fetched: 8 files the job wrote, 52.0 MB; no outputs pattern selects them:"
    assert text[1:6] == [f"  f{i}  {10 - i}.0 MB" for i in range(5)]
    assert text[6] == "  +3 more (12.0 MB; orch fetch job-1 --all fetches everything)"
    assert text[7] == "to fetch them: orch fetch job-1 " + " ".join(f"--include f{i}" for i in range(5))
    assert lines([Unfetched("it's here", 1, 5, "it's here")], "j")[2] == \
        "to fetch it: orch fetch j --include 'it'\"'\"'s here'"  # quoted for the shell
    assert [size_text(n) for n in (0, 1023, 1024, 5 * 2**20, 3 * 2**30)] == ["0 B", "1023 B", "1.0 KB", "5.0 MB",
                                                                            "3.00 GB"]

"""A file the ignore rules leave out, end to end on `local` (issue 22): nanoGPT's `*.bin` in
.gitignore keeps data/synth/train.bin on the laptop. `--dry-run` names the rule and its bytes,
`orch check` the file and the fix, the failed job's reason (status, --json, --follow) the file,
the rule and the fix; with the fix in .orchignore the job runs, and what it wrote to a
relative path comes back through `outputs:`."""

from __future__ import annotations

import json

from tests.support.orch import Orch

TRAIN = """\
import os, sys
data = sys.argv[1].split("=", 1)[1]
with open(data, "rb") as f:
    n = len(f.read())
os.makedirs("out", exist_ok=True)
with open("out/ckpt.pt", "w") as f:
    f.write(f"read {n} bytes\\n")
print("trained on", data, n, flush=True)
"""
FIX = "data/synth/train.bin is excluded by .gitignore:6 '*.bin'; add '!data/synth/*.bin' to .orchignore"


def test_an_excluded_data_file_is_named_from_dry_run_to_failure_and_the_fix_works(orch: Orch) -> None:
    ws = orch.cwd / "nano"
    (ws / "data" / "synth").mkdir(parents=True)
    (ws / "train.py").write_text(TRAIN)
    (ws / "data" / "synth" / "prepare.py").write_text("print('prepare')\n")
    (ws / "data" / "synth" / "train.bin").write_bytes(b"t" * (3 << 20))
    (ws / "data" / "synth" / "val.bin").write_bytes(b"v" * (1 << 20))
    (ws / ".gitignore").write_text("# nanoGPT\n__pycache__/\n.DS_Store\n\nout/\n*.bin\n")
    spec = orch.cwd / "nano.yaml"
    spec.write_text("name: nano\nhosts: [local]\nworkspace: {path: nano}\n"
                    "launch:\n  command: [python, train.py, --data=data/synth/train.bin]\n"
                    "outputs: [out/, logs/, metrics.jsonl]\n")

    dry = orch("submit", str(spec), "--dry-run")
    assert "would sync 3 file(s)" in dry.stderr
    assert "left out by ignore rules: 2 file(s), 4.0 MB" in dry.stderr
    assert ".gitignore:6 '*.bin': 2 file(s), 4.0 MB" in dry.stderr and "largest: data/synth/ 4.0 MB" in dry.stderr
    data = orch.json("submit", str(spec), "--dry-run")
    assert data["selection"]["files"] == 3 and data["plan"]["job_id"].startswith("nano-")
    assert data["selection"]["excluded"]["rules"] == [{"rule": ".gitignore:6 '*.bin'", "source": ".gitignore",
                                                       "line": 6, "pattern": "*.bin", "files": 2,
                                                       "bytes": 4 << 20, "folders": 0}]

    check = orch("check", str(spec))
    assert f"launch.command: {FIX} (the job will not find it)" in check.stderr

    failed = orch("submit", str(spec), "--follow", "--json", check=1)
    result = json.loads(failed.stdout)
    assert result["state"] == "failed" and result["reason"].startswith(FIX)
    assert "No such file or directory: 'data/synth/train.bin'" in result["reason"]
    assert result["excluded"]["rules"][0]["rule"] == ".gitignore:6 '*.bin'"
    job = result["job_id"]
    status = orch.json("status", job)
    assert status["reason"].startswith(FIX) and status["excluded"]["fix"] == ["!data/synth/*.bin"]
    assert FIX in orch("status", job, env={"COLUMNS": "400"}).stdout

    (ws / ".orchignore").write_text("!data/synth/*.bin\n")
    assert "excluded" not in orch("check", str(spec)).stderr
    done = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)
    assert done["state"] == "succeeded" and done["excluded"]["files"] == 0
    orch("fetch", done["job_id"])
    assert (orch.cwd / "runs" / done["job_id"] / "out" / "ckpt.pt").read_text() == f"read {3 << 20} bytes\n"

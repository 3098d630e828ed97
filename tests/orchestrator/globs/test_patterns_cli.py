"""A user's patterns with many wildcards never stall orch (issue 38 item 6's class): through the
CLI, ``workspace.exclude`` and ``.gitignore`` lines that backtracked for hours in the regex
matcher orch used before (pathspec) choose a workspace holding a 250-character name and a
folder 200 deep, and ``outputs:`` patterns of the same kind select among the names the server
lists for ``orch fetch`` (untrusted input). Each command simply has to finish within the
subprocess timeout — and choose exactly the files the patterns say."""

from __future__ import annotations

import json

from tests.support.orch import Orch, write_job

STARS = "*a*a*a*a*a*a*a*b"  # 7 stars: pathspec's regex runs for hours against 250 a's
DEEP = "**/a/**/a/**/a/**/a/**/a/**/b"  # ... 54 s against a/a/.../a/c 90 deep, about an hour 200 deep
LONG, LONG_B = "a" * 250, "a" * 249 + "b"
NEST = "/".join(["a"] * 200)


def test_a_submit_with_catastrophic_excludes_finishes_and_syncs_what_they_say(orch: Orch) -> None:
    spec = write_job(orch.cwd, "stall", "local", ["python", "train.py"],
                     extra="outputs: [outputs/]\n")
    spec.write_text(spec.read_text().replace("workspace: {path: ws}", f"workspace: {{path: ws, exclude: ['{STARS}']}}"))
    ws = orch.cwd / "ws"
    (ws / "train.py").write_text("print('ok')\n")
    (ws / ".gitignore").write_text(DEEP + "\n")
    (ws / LONG).write_text("kept")
    (ws / LONG_B).write_text("left out by workspace.exclude")
    (ws / NEST).mkdir(parents=True)
    (ws / NEST / "c").write_text("kept")
    (ws / NEST / "b").write_text("left out by .gitignore")
    job = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]
    code = orch.job_dir(job) / "code"
    assert (code / LONG).read_text() == "kept" and (code / NEST / "c").read_text() == "kept"
    assert not (code / LONG_B).exists() and not (code / NEST / "b").exists()


JOB = f"""\
import os
os.makedirs("long", exist_ok=True)
for name in ("{LONG[:200]}", "{LONG[:199]}b"):
    open(os.path.join("long", name), "w").write(name[-1])
os.makedirs("{NEST}", exist_ok=True)
for name in ("b", "c"):
    open(os.path.join("{NEST}", name), "w").write(name)
"""


def test_a_fetch_whose_outputs_patterns_are_catastrophic_finishes_and_selects_what_they_say(orch: Orch,
                                                                                             host: str) -> None:
    spec = write_job(orch.cwd, "names", host, ["python", "train.py"], extra=f"outputs: ['{STARS}', '{DEEP}']\n")
    (orch.cwd / "ws" / "train.py").write_text(JOB)
    job = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]
    out = orch("fetch", job)
    run = orch.cwd / "runs" / job
    fetched = sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file() and p.name != ".orch-run")
    assert fetched == [f"{NEST}/b", f"long/{LONG[:199]}b"], out.stdout
    bad = orch("fetch", job, "--include", "[z-a]", check=2)
    assert "the range z-a in [z-a] runs backwards" in bad.stderr and "Traceback" not in bad.stderr


def test_a_line_that_is_not_a_pattern_is_refused_naming_where_it_is_written(orch: Orch) -> None:
    spec = write_job(orch.cwd, "bad", "local", ["python", "train.py"])
    (orch.cwd / "ws" / "train.py").write_text("print('ok')\n")
    spec.write_text(spec.read_text().replace("workspace: {path: ws}", "workspace: {path: ws, exclude: ['ok', 'data\\']}"))
    out = orch("check", str(spec), check=2)
    assert "bad.yaml:3:" in out.stderr and "workspace.exclude[1]: 'data\\\\' is not a pattern: it ends in a lone backslash" \
        in out.stderr and "Traceback" not in out.stderr
    spec.write_text(spec.read_text().replace("exclude: ['ok', 'data\\']", "exclude: []"))
    (orch.cwd / "ws" / ".gitignore").write_text("*.pyc\n\n!\n")
    out = orch("submit", str(spec), check=2)
    assert ".gitignore:3 '!' is not a pattern: nothing follows the '!'" in out.stderr and "Traceback" not in out.stderr

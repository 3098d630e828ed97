"""Symlinks a job makes (issue 38 item 9), through the real CLI against the loopback sshd: none
is ever followed on the server; `orch fetch` names each one with where it points and whether
that is inside the job folder (`--json`: `links`); `--follow-links-inside` fetches a copy of the
targets that stay inside, never one pointing outside (absolute, `..`, a chain), dangling or
looping."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.support.orch import Orch, write_job

LINKS = """\
import os, pathlib
for step in ("step-1", "step-2"):
    os.makedirs(f"outputs/{step}")
    pathlib.Path(f"outputs/{step}/model.bin").write_bytes(step.encode() * 1000)
pathlib.Path("outputs/step-2/config.json").write_text("{}")
os.symlink("step-2", "outputs/latest")                      # a folder inside
os.symlink("latest/model.bin", "outputs/best.bin")          # a file inside, through a chain of two links
os.symlink("/etc/passwd", "outputs/passwd")                 # absolute, outside
os.symlink("../../../../../../../../etc/hostname", "outputs/escape")  # relative, outside
os.symlink(f"../../../{os.environ['ORCH_JOB_ID']}/code/outputs/step-2", "outputs/sneaky")  # out and back in: outside
os.symlink("passwd", "outputs/chained")                     # a chain that leaves through another link
os.symlink("step-9", "outputs/dangling")
os.symlink(".", "outputs/here")                             # a folder holding the link
"""
KINDS = {"outputs/latest": ("dir", "step-2", "outputs/step-2"), "outputs/best.bin": ("file", "latest/model.bin",
                                                                                       "outputs/step-2/model.bin"),
         "outputs/passwd": ("outside", "/etc/passwd", None),
         "outputs/escape": ("outside", "../../../../../../../../etc/hostname", None),
         "outputs/sneaky": ("outside", "../../../JOB/code/outputs/step-2", None),
         "outputs/chained": ("outside", "passwd", None),
         "outputs/dangling": ("dangling", "step-9", None), "outputs/here": ("loop", ".", None)}


def files(run: Path) -> dict[str, bytes]:
    """Every file under ``run`` (never through a link: the fetch must make none) and its bytes."""
    out = {}
    for dirpath, _, names in os.walk(run):
        for name in names:
            path = Path(dirpath) / name
            assert not path.is_symlink(), path
            out[path.relative_to(run).as_posix()] = path.read_bytes()
    return out


def test_every_link_is_named_and_only_those_inside_the_job_folder_are_followed_when_asked(orch: Orch, box: str) -> None:
    spec = write_job(orch.cwd, "links", box, ["python", "train.py"])
    (orch.cwd / "ws" / "train.py").write_text(LINKS)
    job = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]
    run = orch.cwd / "runs" / job

    plain = json.loads(orch("fetch", job, "--json").stdout)
    kinds = {path: (kind, target.replace("JOB", job), to) for path, (kind, target, to) in KINDS.items()}
    assert {k["path"]: (k["kind"], k["target"], k["to"]) for k in plain["links"]} == kinds
    assert {k["path"] for k in plain["links"] if k["inside"]} == {"outputs/latest", "outputs/best.bin"}
    assert not any(k["followed"] for k in plain["links"])
    assert set(files(run)) >= {"outputs/step-1/model.bin", "outputs/step-2/model.bin", "outputs/step-2/config.json"}
    assert not any(name.startswith(tuple(KINDS)) for name in files(run))  # no link, nothing through one

    said = orch("fetch", job).stderr.splitlines()  # the same, in words: one line per link
    for path, (kind, target, to) in kinds.items():
        (line,) = [line for line in said if line.startswith(f"orch: {path} -> {target}: not fetched")]
        assert {"dir": f"a link to the folder {to} inside the job folder (--follow-links-inside",
                "file": f"a link to the file {to} inside the job folder", "outside": "points outside the job folder",
                "dangling": "dangling", "loop": "a folder that holds it"}[kind] in line

    followed = json.loads(orch("fetch", job, "--follow-links-inside", "--json").stdout)
    assert {k["path"] for k in followed["links"] if k["followed"]} == {"outputs/latest", "outputs/best.bin"}
    assert sorted(followed["fetched"]) == ["outputs/best.bin", "outputs/latest/config.json", "outputs/latest/model.bin"]
    got = files(run)
    assert got["outputs/latest/model.bin"] == got["outputs/best.bin"] == b"step-2" * 1000
    assert got["outputs/latest/config.json"] == b"{}"
    assert not any(name.startswith(tuple(set(KINDS) - {"outputs/latest", "outputs/best.bin"})) for name in got)
    assert b"root:" not in b"".join(got.values())  # /etc/passwd never came
    said = orch("fetch", job, "--follow-links-inside").stderr
    assert "orch: outputs/latest -> step-2: fetched as a copy of outputs/step-2 (2 file(s))" in said
    assert "orch: outputs/passwd -> /etc/passwd: not fetched: it points outside the job folder" in said
    again = json.loads(orch("fetch", job, "--follow-links-inside", "--json").stdout)
    assert again["fetched"] == [] and "outputs/latest/model.bin" in again["unchanged"]  # idempotent

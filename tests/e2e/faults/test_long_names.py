"""Names at the file system's limit (issue 23, class 4): every temporary orch makes beside a
user's file — the sync's on the server, `--pull-remote-edits`' on the laptop, fetch's `.part`
and checkpoint folders, a move's staging part — fits wherever the final name fits (255
bytes, ASCII and multi-byte UTF-8). Where a final name itself cannot be written on the
laptop, `orch fetch` fetches the rest, names what it could not and exits 2."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

from orchestrator.move.resume_on import todo_for
from remote_payload.move import job as movejob
from tests.support.orch import Orch, write_job

ASCII_255 = "n" * 251 + ".txt"
UTF8_255 = "é" * 126 + "abc"  # 126 × 2 bytes + 3
FOLDER_255 = "f" * 255
assert all(len(n.encode()) == 255 for n in (ASCII_255, UTF8_255, FOLDER_255))


def digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def no_temporaries(root: Path) -> bool:
    return not [p for p in root.rglob("*") if p.name.startswith((".orch-tmp-", ".orch-pull-", ".part-", ".gone-"))
                or p.name.endswith((".part", ".orch-part"))]


CHECK = """\
import hashlib, json, pathlib
print(json.dumps({p.as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                  for p in sorted(pathlib.Path('.').rglob('*')) if p.is_file() and p.suffix != '.py'}))
"""


def test_workspace_files_with_255_byte_names_sync_change_and_come_back(orch: Orch, box: str) -> None:
    spec = write_job(orch.cwd, "names", box, ["python", "check.py"])
    ws = orch.cwd / "ws"
    (ws / "check.py").write_text(CHECK)
    (ws / ASCII_255).write_bytes(os.urandom(50_000))
    (ws / UTF8_255).write_text("first\n")
    (ws / FOLDER_255).mkdir()
    (ws / FOLDER_255 / UTF8_255).write_bytes(os.urandom(2_000_000))
    done = orch.json("submit", str(spec), "--follow")
    assert done["state"] == "succeeded"
    dest = orch.server_workspace(ws)
    local = {k: v for k, v in digests(ws).items() if not k.endswith(".py")}
    assert {k: v for k, v in digests(dest).items() if not k.endswith(".py")} == local
    printed = [line for line in orch("logs", done["job_id"]).stdout.splitlines() if line.startswith("{")]
    assert json.loads(printed[-1]) == local  # the job saw them
    assert no_temporaries(dest)

    (ws / ASCII_255).write_bytes(os.urandom(60_000))  # changed: lands under its temporary again, then its name
    (dest / UTF8_255).write_text("edited on the server\n")  # (VSCode Remote)
    refused = orch("submit", str(spec), check=2)
    assert "changed on the server" in refused.stderr and UTF8_255 in refused.stderr
    again = orch.json("submit", str(spec), "--pull-remote-edits", "--follow")
    assert again["state"] == "succeeded"
    assert (ws / UTF8_255).read_text() == "edited on the server\n"  # brought back under its 255-byte name
    assert digests(dest)[ASCII_255] == digests(ws)[ASCII_255]
    assert no_temporaries(ws) and no_temporaries(dest)


MAKE = """\
import json, os, pathlib
names = json.load(open("names.json"))
out = pathlib.Path("outputs")
out.mkdir()
(out / "ok.txt").write_text("fine\\n")
for name in names:
    (out / name).write_bytes(os.urandom(300_000))
step = pathlib.Path(os.environ["ORCH_JOB_DIR"]) / "checkpoints" / "step-1"
step.mkdir(parents=True)
(step / names[0]).write_bytes(os.urandom(100_000))
(step / "COMPLETE").write_text("")
"""


def test_outputs_with_255_byte_names_are_fetched_and_one_the_laptop_cannot_hold_is_named(
        orch: Orch, box: str, tmp_path: Path) -> None:
    spec = write_job(orch.cwd, "long", box, ["python", "make.py"])
    (orch.cwd / "ws" / "make.py").write_text(MAKE)
    (orch.cwd / "ws" / "names.json").write_text(json.dumps([ASCII_255, UTF8_255]))
    job = orch.json("submit", str(spec), "--follow")["job_id"]
    server = orch.job_dir(job)

    orch("fetch", job, "--checkpoints")
    here = orch.cwd / "runs" / job
    for rel in ("outputs/ok.txt", f"outputs/{ASCII_255}", f"outputs/{UTF8_255}", f"checkpoints/step-1/{ASCII_255}"):
        src = server / ("code/" + rel if rel.startswith("outputs/") else rel)
        assert (here / rel).read_bytes() == src.read_bytes(), rel
    assert no_temporaries(here)

    # A destination this deep leaves no room in the path for a 255-byte name (PATH_MAX), but
    # does for outputs/ok.txt: the rest is fetched, the two are named, exit 2.
    room = 4096 - len(f"/{job}/outputs/") - 100
    deep = tmp_path
    while len(str(deep)) < room - 200:
        deep = deep / ("d" * min(200, room - len(str(deep)) - 1))
    deep.mkdir(parents=True)
    out = orch("fetch", job, "--dest", str(deep), check=2)
    assert "2 file(s) this laptop cannot hold under their names" in out.stderr, out.stderr
    assert ASCII_255 in out.stderr and "File name too long" in out.stderr and "--dest" in out.stderr
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr
    assert (deep / job / "outputs" / "ok.txt").read_text() == "fine\n"
    assert (deep / job / "logs").is_dir()
    assert no_temporaries(deep / job)


def test_a_move_part_of_a_255_byte_name_fits_and_a_cut_copy_continues(tmp_path: Path) -> None:
    """The target's staging part (``<path>.orch-part``) of a 255-byte name gets a short name;
    ``move_have`` reports it so the laptop's next copy continues from its size."""
    root, job = str(tmp_path), "long-20260101-000000-abcd"
    rel = f"outputs/{UTF8_255}"
    data = os.urandom(3_000_000)
    entry = {"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "mtime_ns": 1}
    header = json.dumps({"path": rel, "offset": 0, "size": len(data)}).encode() + b"\n"
    try:
        movejob.receive(root, job, [entry], io.BytesIO(header + data[:1_000_000]))  # the link is cut mid-file
        raise AssertionError("a cut stream must not look complete")
    except movejob.MoveError as exc:
        assert "ended mid-file" in str(exc)
    have = movejob.have(root, job, os.path.join(root, "jobs", job))
    todo = todo_for(have, [entry])
    assert todo == [{"path": rel, "offset": 1_000_000, "size": len(data)}]
    rest = json.dumps({"path": rel, "offset": 1_000_000, "size": len(data) - 1_000_000}).encode() + b"\n"
    done = movejob.receive(root, job, [entry], io.BytesIO(rest + data[1_000_000:] + b'{"end": true}\n'))
    assert done == {"written": 1, "bytes": len(data) - 1_000_000}
    stage = Path(movejob.stage_dir(root, job))
    assert (stage / rel).read_bytes() == data
    assert not [p for p in stage.rglob("*") if p.name.endswith(".orch-part")]

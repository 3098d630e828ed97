"""The environment record is kept per environment: a second job with the same Python and the same
installed packages copies it instead of importing torch and running ``pip freeze`` again; a
change to what is installed, a commit in an editable install's source or another GPU visibility
records afresh.
A real Python (this one, with torch), behind a shim that logs what it is asked to run."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import pytest

from remote_payload.jobdir.record import PROBE, STAMP, record_environment

SHIM = """#!/bin/sh
if [ "$1" = -c ] && [ "$2" = "$STAMP_CODE" ]; then echo stamp >> "$SHIM_LOG"
elif [ "$1" = -c ] && [ "$2" = "$PROBE_CODE" ]; then echo probe >> "$SHIM_LOG"
elif [ "$1 $2 $3" = "-m pip freeze" ]; then echo freeze >> "$SHIM_LOG"
fi
exec "$REAL_PYTHON" "$@"
"""


@pytest.fixture
def shim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    python = tmp_path / "python"
    python.write_text(SHIM)
    python.chmod(0o755)
    extra = tmp_path / "site"  # a folder on sys.path this test may install into
    extra.mkdir()
    for name, value in (("STAMP_CODE", STAMP), ("PROBE_CODE", PROBE), ("SHIM_LOG", str(tmp_path / "log")),
                        ("REAL_PYTHON", sys.executable), ("PYTHONPATH", str(extra))):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return python


def record(tmp_path: Path, python: Path, job: str) -> tuple[list[str], dict, str]:
    """Record job ``job``'s environment; (what the shim ran, environment.json, pip-freeze.txt)."""
    log = tmp_path / "log"
    log.unlink(missing_ok=True)
    record_environment(str(tmp_path / "jobs" / job), str(python), cache=str(tmp_path / "state" / "environment"))
    repro = tmp_path / "jobs" / job / "repro"
    ran = log.read_text().split() if log.exists() else []
    return ran, json.loads((repro / "environment.json").read_text()), (repro / "pip-freeze.txt").read_text()


def install(site: Path, name: str, editable: bool = False, source: Path | None = None) -> None:
    """A package's metadata as pip leaves it (an editable one of ``source`` with its direct_url.json)."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "INSTALLER").write_text("pip\n")
    if editable and source is not None:
        (info / "direct_url.json").write_text(json.dumps({"url": source.as_uri(), "dir_info": {"editable": True}}))


def test_a_second_job_in_the_same_environment_copies_the_kept_record(tmp_path: Path, shim: Path) -> None:
    ran, env, freeze = record(tmp_path, shim, "a")
    assert ran == ["stamp", "probe", "freeze", "stamp"]  # probed, and the stamp checked again before keeping it
    assert env["python"] == sys.version.split()[0] and env["torch"].startswith("2.") and "torch==" in freeze
    ran, again, freeze_again = record(tmp_path, shim, "b")
    assert ran == ["stamp"] and again == env and freeze_again == freeze  # nothing imported torch or ran pip

    install(Path(os.environ["PYTHONPATH"]), "fresh_pkg")  # what is installed changed: its folder's mtime
    ran, env, freeze = record(tmp_path, shim, "c")
    assert ran == ["stamp", "probe", "freeze", "stamp"] and "fresh-pkg==1.0" in freeze.lower().replace("_", "-")
    assert record(tmp_path, shim, "d")[0] == ["stamp"]


def test_an_editable_install_or_another_gpu_visibility_is_recorded_afresh(
        tmp_path: Path, shim: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "mine"
    (source / ".git").mkdir(parents=True)
    install(Path(os.environ["PYTHONPATH"]), "mine", editable=True, source=source)
    ran, _, freeze = record(tmp_path, shim, "a")
    assert ran == ["stamp", "probe", "freeze", "stamp"] and f"-e {source}" in freeze.splitlines()
    assert record(tmp_path, shim, "b")[0] == ["stamp"]
    (source / ".git" / "ORIG_HEAD").write_text("0" * 40)  # a commit there: its freeze line may name another
    assert record(tmp_path, shim, "c")[0] == ["stamp", "probe", "freeze", "stamp"]
    assert record(tmp_path, shim, "d")[0] == ["stamp"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # torch.cuda.is_available() may answer otherwise
    assert record(tmp_path, shim, "e")[0] == ["stamp", "probe", "freeze", "stamp"]
    assert record(tmp_path, shim, "f")[0] == ["stamp"]
    for entry in (tmp_path / "state" / "environment").iterdir():
        entry.write_text("{not json")  # a damaged entry is probed again, and replaced
    assert record(tmp_path, shim, "g")[0] == ["stamp", "probe", "freeze", "stamp"]
    assert record(tmp_path, shim, "h")[0] == ["stamp"]


def test_jobs_started_back_to_back_probe_their_environment_once(tmp_path: Path, shim: Path) -> None:
    """The second job's record starts while the first's still imports torch: it waits for that
    record and copies it, instead of probing beside it (seconds of CPU on a box that is busy
    starting the next job)."""
    cache = str(tmp_path / "state" / "environment")
    jobs = [threading.Thread(target=record_environment, args=(str(tmp_path / "jobs" / j), str(shim)),
                             kwargs={"cache": cache}) for j in ("a", "b", "c")]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join()
    ran = (tmp_path / "log").read_text().split()
    assert ran.count("probe") == 1 and ran.count("freeze") == 1 and ran.count("stamp") == 4, ran
    records = [json.loads((tmp_path / "jobs" / j / "repro" / "environment.json").read_text()) for j in "abc"]
    assert records[0] == records[1] == records[2] and records[0]["torch"].startswith("2.")

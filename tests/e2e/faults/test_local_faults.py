"""Faults of the laptop itself (issue 10, point 7): an unreadable workspace file, a disk that
fills during `orch fetch`, a damaged registry.db, broken hosts/*.json. Each is one line naming
the file and the fix, with exit 2 (`LocalFileError`, a `UsageError`), never `internal error`
or a traceback, and nothing is launched. Every case drives the real CLI."""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.orch import Orch, tmpfs, write_job
from tests.support.tiers import needs


def launched(orch: Orch) -> list[Path]:
    """Job folders on every host these tests use: the loopback sshd's root and `local`'s."""
    return [*orch.remote_root.glob("jobs/*"), *(orch.home / "local").glob("jobs/*")]


def assert_clean(out: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 2, one `error:` line holding every needle, no internal error or traceback."""
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, out.stderr
    for needle in needles:
        assert needle in errors[0], out.stderr
    assert "internal error" not in out.stderr and "Traceback" not in out.stderr


# --- an unreadable workspace file -------------------------------------------------------


@pytest.mark.root  # setpriv drops capabilities only root holds
def test_an_unreadable_workspace_file_stops_submit_naming_it(orch: Orch, host: str) -> None:
    spec = write_job(orch.cwd, "unreadable", host, ["python", "train.py"])
    (orch.cwd / "ws" / "train.py").write_text("print('ran')\n")
    secret = orch.cwd / "ws" / "data.csv"
    secret.write_text("a,b\n")
    secret.chmod(0o000)
    # As root, but without the powers that read past file modes: a user who cannot read it.
    out = subprocess.run(["setpriv", "--bounding-set", "-dac_override,-dac_read_search", sys.executable, "-m",
                          "orchestrator", "submit", str(spec)], cwd=orch.cwd, env=orch.env,
                         capture_output=True, text=True, timeout=120)
    assert_clean(out, str(secret), "permission denied")
    assert launched(orch) == [] and orch.json("ls") == []


# --- the laptop's disk fills during `orch fetch` ----------------------------------------


@pytest.fixture
@needs("root")
def small_disk(tmp_path: Path) -> Path:
    with tmpfs(tmp_path / "small", "8m") as mount:
        yield mount


def test_a_full_disk_during_fetch_names_the_part_file_and_the_fetch_resumes_after_freeing_space(
        orch: Orch, host: str, small_disk: Path) -> None:
    spec = write_job(orch.cwd, "big", host, ["python", "make.py"])
    (orch.cwd / "ws" / "make.py").write_text(
        "import os, pathlib\nout = pathlib.Path(os.environ['ORCH_JOB_DIR']) / 'outputs'\nout.mkdir()\n"
        "(out / 'weights.bin').write_bytes(os.urandom(6_000_000))\n")
    job = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * 5_000_000)  # leaves about 3 MB of the 8 MB disk
    out = orch("fetch", job, "--dest", str(small_disk), check=None)
    part = small_disk / job / "outputs" / "weights.bin.part"
    assert_clean(out, "disk is full", str(part), "run the same `orch fetch` again", "resumes")
    assert part.is_file() and 0 < part.stat().st_size < 6_000_000
    assert not part.with_name("weights.bin").exists()
    ballast.unlink()  # free space
    again = orch("fetch", job, "--dest", str(small_disk))
    moved_mb = float(again.stdout.split("(")[1].split(" MB")[0])
    assert moved_mb < 5.5  # resumed from the .part file, not restarted
    final = part.with_name("weights.bin")
    assert final.read_bytes() == (orch.job_dir(job) / "outputs" / "weights.bin").read_bytes()
    assert not part.exists()


# --- a damaged registry.db ---------------------------------------------------------------


def _garbage(db: Path) -> None:
    db.write_bytes(os.urandom(20_000))


def _truncated(db: Path) -> None:
    data = db.read_bytes()
    db.write_bytes(data[:len(data) // 2])


def _not_sqlite(db: Path) -> None:
    db.write_text('{"jobs": []}\n')


def _another_programs_database(db: Path) -> None:
    db.unlink()
    with sqlite3.connect(db) as other:
        other.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, title TEXT)")


@pytest.mark.parametrize("damage", [_garbage, _truncated, _not_sqlite, _another_programs_database])
def test_a_damaged_registry_is_named_with_the_way_out(orch: Orch, damage) -> None:
    spec = write_job(orch.cwd, "kept", "local", ["python", "-c", "print('done')"])
    job = json.loads(orch("submit", str(spec), "--follow", "--json").stdout)["job_id"]
    db = orch.home / "registry.db"
    assert db.stat().st_size >= 8192  # a real registry of two pages or more: truncating cuts one off
    damage(db)
    before = launched(orch)
    for args in (["status"], ["submit", str(spec)], ["logs", job]):
        assert_clean(orch(*args, check=None), f"{db} is damaged", "move it aside", "stay on their hosts")
    assert launched(orch) == before
    db.rename(db.with_name("registry.db.damaged"))  # the advice: move it aside
    assert orch.json("ls") == []
    assert (orch.home / "local" / "jobs" / job / "status.json").is_file()  # the job lives on its host


# --- broken hosts/*.json ------------------------------------------------------------------


BROKEN_ENTRIES = {
    "not UTF-8": lambda good: b"\xff\xfe" + good,
    "not JSON": lambda good: b"{name: box,",
    "key not base64": lambda good: json.dumps({**json.loads(good), "host_key": "ssh-ed25519 not*base64!"}).encode(),
    "key not a key": lambda good: json.dumps({**json.loads(good), "host_key": "ssh-ed25519 " + base64.b64encode(
        b"\0\0\0\x07ssh-rsa\0\0\0\x01\x03").decode()}).encode(),
    "name differs": lambda good: json.dumps({**json.loads(good), "name": "other"}).encode(),
    "a newer orch's field": lambda good: json.dumps({**json.loads(good), "jump_host": "bastion"}).encode(),
}
PROBLEMS = {"not UTF-8": "not UTF-8", "not JSON": "Invalid JSON", "key not base64": "not valid base64",
            "key not a key": "not a valid ssh-ed25519 key", "name differs": "its name is 'other'",
            "a newer orch's field": "jump_host: a field this orch does not know, so a newer orch wrote it; upgrade orch"}


@pytest.mark.parametrize("kind", list(BROKEN_ENTRIES))
def test_a_broken_host_entry_is_named_with_the_fix_and_launches_nothing(orch: Orch, box: str, sshd, kind: str) -> None:
    entry = orch.home / "hosts" / "box.json"
    good = entry.read_bytes()
    (orch.home / "hosts" / "spare.json").write_text(json.dumps({**json.loads(good), "name": "spare"}))
    entry.write_bytes(BROKEN_ENTRIES[kind](good))
    spec = write_job(orch.cwd, "nope", "box", ["python", "-c", "print('must not run')"])
    for args in (["submit", str(spec)], ["exec", "box", "--", "true"], ["hosts", "trust", "box"]):
        assert_clean(orch(*args, check=None), str(entry), PROBLEMS[kind], "orch hosts rm box", "orch hosts add box")
    assert launched(orch) == [] and orch.json("ls") == []
    listing = orch("hosts", "ls")  # the good hosts are still listed; the broken one is flagged
    rows = {line.split()[0]: line for line in listing.stdout.splitlines()[1:] if line.strip()}
    assert set(rows) == {"local", "spare", "box"} and "BROKEN" in rows["box"] and "BROKEN" not in rows["spare"]
    assert str(entry) in listing.stderr and "Traceback" not in listing.stderr
    orch("hosts", "rm", "box")  # the fix the message names
    orch("hosts", "add", "box", "--ssh", f"ssh -p {sshd.port} root@127.0.0.1", "--identity", str(sshd.client_key),
         "--root", str(orch.remote_root), "--python", sys.executable, "--trust")
    assert orch("exec", "box", "--", "echo", "fixed").stdout.strip() == "fixed"

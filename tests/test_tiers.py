"""The test tiers (tests/support/tiers.py) on a small suite of their own, run by a real pytest in
a subprocess: ``--fast`` leaves out exactly the tests whose fixtures or markers need root,
network namespaces or Slurm and says so at the start and the end, in one process and with
workers; a skip fails the run; a test that reaches a tier's support code unmarked fails naming
the marker; ``--fast`` is refused where CI is set; and, run as a user without root, the tier
tests fail at setup saying what is missing while ``--fast`` passes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SUITE = '''
import pytest
from tests.support.tiers import needs


@pytest.fixture(scope="session")
@needs("root")
def sshd():
    return "sshd"


@pytest.fixture
def box(sshd):
    return "box on " + sshd


@pytest.fixture(scope="session")
@needs("slurm", "netns")
def slurm2_cluster():
    return "slurm2"


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.root)])
def host(request):
    return request.param


def test_plain():
    assert 1 + 1 == 2


def test_on_a_host(host):
    assert host in ("local", "ssh")


def test_through_box(box):
    assert box == "box on sshd"


def test_on_slurm2(slurm2_cluster):
    assert slurm2_cluster == "slurm2"


@pytest.mark.netns
def test_marked_netns():
    assert True
'''
LEFT_OUT = ("--fast left out 4 tests that need root, network namespaces or Slurm: 1 slurm, 1 netns, 2 root "
            "(pytest --markers says what each tier needs)")


def suite(tmp_path: Path, **files: str) -> Path:
    """A folder holding ``files`` and a pytest.ini registering the tiers as pyproject.toml does."""
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n" + "".join(f"    {m}\n" for m in markers))
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(text)
    tmp_path.chmod(0o755)
    return tmp_path


def pytest_run(folder: Path, *args: str, env: dict[str, str] | None = None,
               prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER")}
    return subprocess.run([*prefix, sys.executable, "-m", "pytest", "-p", "tests.support.tiers", "-p", "no:cacheprovider",
                           "-q", *args], cwd=folder, env={**base, "PYTHONPATH": str(REPO), **(env or {})},
                          capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_fast_leaves_out_each_tier_and_says_how_many_at_the_start_and_the_end(tmp_path: Path, workers: str) -> None:
    run = pytest_run(suite(tmp_path, test_suite=SUITE), "--fast", "-n", workers, "-rA")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(LEFT_OUT) == 2, run.stdout  # after the collection, and in the summary
    assert run.stdout.count("everything, as CI runs it: bash scripts/test.sh") == 2
    assert run.stdout.index(LEFT_OUT) < run.stdout.index("PASSED")
    passed = sorted(re.findall(r"PASSED (\S+)", run.stdout))
    assert passed == ["test_suite.py::test_on_a_host[local]", "test_suite.py::test_plain"]
    assert "2 passed" in run.stdout and "skipped" not in run.stdout


@pytest.mark.slurm  # its little suite's tier tests check this machine has what they need
@pytest.mark.netns
def test_without_fast_every_tier_runs(tmp_path: Path) -> None:
    run = pytest_run(suite(tmp_path, test_suite=SUITE), "-n", "0")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "6 passed" in run.stdout and "left out" not in run.stdout


def test_markers_select_a_tier_and_a_tier_implies_root(tmp_path: Path) -> None:
    folder = suite(tmp_path, test_suite=SUITE)
    root = pytest_run(folder, "-n", "0", "-m", "root", "--collect-only")
    assert sorted(re.findall(r"^test_suite.py::(\S+)$", root.stdout, re.M)) == [
        "test_marked_netns", "test_on_a_host[ssh]", "test_on_slurm2", "test_through_box"]
    slurm = pytest_run(folder, "-n", "0", "-m", "slurm", "--collect-only")
    assert re.findall(r"^test_suite.py::(\S+)$", slurm.stdout, re.M) == ["test_on_slurm2"]


def test_a_skip_fails_the_run_with_fast_and_without(tmp_path: Path) -> None:
    folder = suite(tmp_path, test_skip="import pytest\n\n\ndef test_skips():\n    pytest.skip('not today')\n")
    for args in (("--fast",), ()):
        run = pytest_run(folder, "-n", "0", *args)
        assert run.returncode == 1, run.stdout
        assert "1 failed" in run.stdout and "not today" in run.stdout
        assert "A skipped test asserts nothing, and this suite skips none" in run.stdout


def test_reaching_a_tiers_support_code_unmarked_fails_naming_the_marker(tmp_path: Path) -> None:
    folder = suite(tmp_path, test_unmarked=(
        "from tests.support.sshd import ensure_user\n\n\ndef test_makes_a_user():\n    ensure_user('orchnever')\n"))
    run = pytest_run(folder, "-n", "0")
    assert run.returncode == 1, run.stdout
    assert "ensure_user('orchnever') needs the 'root' test tier, but this test is not marked 'root'" in run.stdout
    assert "@pytest.mark.root" in run.stdout
    assert subprocess.run(["id", "orchnever"], capture_output=True).returncode != 0  # refused before useradd


def test_fast_is_refused_where_ci_is_set(tmp_path: Path) -> None:
    run = pytest_run(suite(tmp_path, test_suite=SUITE), "--fast", "-n", "0", env={"CI": "true"})
    assert run.returncode == 4, run.stdout + run.stderr
    assert "--fast leaves tests out, and CI runs every tier: run bash scripts/test.sh" in run.stderr
    assert pytest_run(tmp_path, "--fast", "-n", "0", env={"CI": "false"}).returncode == 0


@pytest.mark.root  # it becomes another user
def test_as_a_user_without_root_the_tier_tests_fail_saying_so_and_fast_passes() -> None:
    folder = suite(Path(tempfile.mkdtemp(prefix="orch-tiers-")), test_suite=SUITE)  # not under pytest's 0700 root
    nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
    try:
        as_nobody(folder, nobody)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def as_nobody(folder: Path, nobody: tuple[str, ...]) -> None:
    run = pytest_run(folder, "-n", "0", env={"HOME": str(folder)}, prefix=nobody)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "2 passed, 4 errors" in run.stdout, run.stdout  # each tier test fails at its setup
    assert "this test needs what this machine lacks (root: not running as root (CI runs as root))" in run.stdout
    assert "`bash scripts/test.sh --fast` leaves out every such test" in run.stdout
    fast = pytest_run(folder, "--fast", "-n", "0", env={"HOME": str(folder)}, prefix=nobody)
    assert fast.returncode == 0 and "2 passed" in fast.stdout, fast.stdout + fast.stderr

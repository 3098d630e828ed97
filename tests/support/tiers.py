"""Test tiers: what a test needs of the machine beyond Python (pytest markers ``root``, ``netns``,
``slurm``, registered with what each needs in pyproject.toml).

A test's tiers come from what it uses, at collection: a fixture declared with ``@needs(...)``
(the loopback ``sshd``, the network-namespace ``cluster``, the Slurm clusters) gives its tiers
to every test that uses it, directly or through other fixtures; a fixture parameter or a test
may also carry the marker itself (``pytest.param("ssh", marks=pytest.mark.root)``,
``@pytest.mark.root``). A tier implies ``root`` (network namespaces and Slurm's daemons need it).
The support functions that need a tier (``ensure_user``, ``start_sshd``, ``start_cluster``,
``start_slurm``, ``tmpfs``) call ``need``: a test that reaches one without carrying its tier
fails and says which marker it lacks, so a new test cannot leave the tier out unnoticed.

``pytest --fast`` (``bash scripts/test.sh --fast``) deselects every test of a tier, and says at
the start and at the end how many it left out and the command that runs everything; without it
a test whose tier this machine lacks fails at setup naming what is missing. ``--fast`` is refused
where ``CI`` is set: CI runs every tier. Any skip fails the test (``pytest.skip`` included): a
skipped test asserts nothing, and the suite has none on purpose.

The hooks below are pytest hooks; tests/conftest.py imports them, which registers them."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import pytest

# The order counts: a left-out test is counted under the first tier it needs.
TIERS = ("slurm", "netns", "root")
IMPLIED: dict[str, tuple[str, ...]] = {"slurm": ("root",), "netns": ("root",), "root": ()}
EVERYTHING = "bash scripts/test.sh"
FAST = f"{EVERYTHING} --fast"
_ATTR = "_orch_tiers"
_REPORT = "orch_tiers_report"  # xdist workerinput key: where a worker writes what it left out

F = TypeVar("F", bound=Callable[..., Any])

_tiers = pytest.StashKey[frozenset[str]]()  # on an item: its tiers
_left_out = pytest.StashKey[dict[str, int]]()  # on the config: tier -> tests --fast left out
_said = pytest.StashKey[bool]()  # xdist's controller printed what the workers left out
_report_path = pytest.StashKey[str]()

# The tiers of the test running in this process; None outside a test (a stand-in started by hand).
_running: frozenset[str] | None = None


def needs(*tiers: str) -> Callable[[F], F]:
    """Declare a fixture's tiers (below ``@pytest.fixture``): every test using it gets them."""
    unknown = set(tiers) - set(TIERS)
    if unknown:
        raise ValueError(f"unknown test tier(s) {sorted(unknown)}: the tiers are {list(TIERS)}")

    def mark(func: F) -> F:
        setattr(func, _ATTR, frozenset(tiers))
        return func
    return mark


def need(tier: str, what: str) -> None:
    """Called by support code that needs ``tier`` (``what`` names it): AssertionError when the
    running test does not carry that tier's marker. Never raises outside a test."""
    if _running is not None and tier not in _running:
        raise AssertionError(
            f"{what} needs the {tier!r} test tier, but this test is not marked {tier!r}: "
            f"mark the test @pytest.mark.{tier}, or the fixture that calls it @needs({tier!r}) "
            "(tests/support/tiers.py), so that `--fast` leaves it out")


def closed(tiers: set[str]) -> frozenset[str]:
    """``tiers`` with the tiers they imply."""
    return frozenset(tiers | {implied for tier in tiers for implied in IMPLIED[tier]})


def tiers_of(item: pytest.Item) -> frozenset[str]:
    """The tiers a collected test needs: its markers and those of every fixture it uses."""
    found = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        for fixturedef in (info.name2fixturedefs.get(name, ()) if info is not None else ()):
            found |= getattr(fixturedef.func, _ATTR, frozenset())
    return closed(found)


def missing(tier: str) -> str | None:
    """What this machine lacks for ``tier``; None when it has it."""
    if tier == "root":
        return None if os.geteuid() == 0 else "not running as root (CI runs as root)"
    if tier == "netns":
        return None if shutil.which("ip") or Path("/usr/sbin/ip").exists() else "iproute2's `ip`"
    from tests.support.slurm import available

    return available()


def left_out_lines(counts: dict[str, int]) -> list[str]:
    """The lines that say what ``--fast`` left out (``counts``: tier -> tests)."""
    parts = ", ".join(f"{counts.get(tier, 0)} {tier}" for tier in TIERS)
    return [f"--fast left out {sum(counts.values())} tests that need root, network namespaces or Slurm: {parts} "
            "(pytest --markers says what each tier needs)",
            f"everything, as CI runs it: {EVERYTHING}"]


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def _say(config: pytest.Config, lines: list[str]) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        for line in lines:
            reporter.write_line(line, yellow=True, bold=True)


# --- hooks (imported by tests/conftest.py) ---------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true", default=False,
                     help=f"leave out the tests that need {', '.join(TIERS)} (a machine without them); "
                          "refused where CI is set")


def pytest_configure(config: pytest.Config) -> None:
    registered = {line.split(":")[0].strip() for line in config.getini("markers")}
    if not registered.issuperset(TIERS):
        raise pytest.UsageError(f"the test tiers {list(TIERS)} must be registered as markers in pyproject.toml")
    if config.getoption("fast") and _ci():
        raise pytest.UsageError(f"--fast leaves tests out, and CI runs every tier: run {EVERYTHING} "
                                f"(CI={os.environ.get('CI')!r} is set here)")
    config.stash[_left_out] = {}
    if config.getoption("fast") and not hasattr(config, "workerinput"):
        fd, path = tempfile.mkstemp(prefix="orch-tiers-", suffix=".json")
        os.close(fd)
        os.unlink(path)
        config.stash[_report_path] = path


def pytest_unconfigure(config: pytest.Config) -> None:
    path = config.stash.get(_report_path, None)
    if path:
        Path(path).unlink(missing_ok=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist's controller: tell each worker where to write what it left out."""
    path = node.config.stash.get(_report_path, None)
    if path:
        node.workerinput[_REPORT] = path


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped = [], []
    counts: Counter[str] = Counter()
    for item in items:
        tiers = tiers_of(item)
        for tier in tiers:
            item.add_marker(tier)
        item.stash[_tiers] = tiers
        if config.getoption("fast") and tiers:
            dropped.append(item)
            counts[next(tier for tier in TIERS if tier in tiers)] += 1
        else:
            kept.append(item)
    if not config.getoption("fast"):
        return
    items[:] = kept
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    config.stash[_left_out] = dict(counts)
    report = getattr(config, "workerinput", {}).get(_REPORT)
    if report:  # a worker: the controller prints it (every worker collects the same tests)
        scratch = f"{report}.{os.getpid()}"
        Path(scratch).write_text(json.dumps(counts))
        os.replace(scratch, report)


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    return left_out_lines(config.stash[_left_out]) if config.getoption("fast") else []


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """xdist's controller: print, once, what the workers left out."""
    config = node.config
    path = config.stash.get(_report_path, None)
    if not path or config.stash.get(_said, False) or not Path(path).exists():
        return
    config.stash[_said] = True
    config.stash[_left_out] = json.loads(Path(path).read_text())
    _say(config, left_out_lines(config.stash[_left_out]))


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if config.getoption("fast") and not hasattr(config, "workerinput"):
        terminalreporter.section("test tiers", yellow=True)
        for line in left_out_lines(config.stash[_left_out]):
            terminalreporter.write_line(line)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    global _running
    _running = item.stash.get(_tiers, frozenset())
    try:
        return (yield)
    finally:
        _running = None


def pytest_runtest_setup(item: pytest.Item) -> None:
    lacking = [f"{tier}: {why}" for tier in TIERS if tier in item.stash.get(_tiers, ()) if (why := missing(tier))]
    if lacking:
        pytest.fail(f"this test needs what this machine lacks ({'; '.join(lacking)}); "
                    f"`{FAST}` leaves out every such test", pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (f"{reason}\nA skipped test asserts nothing, and this suite skips none: make it run "
                           f"(a test that needs root, network namespaces or Slurm is marked, and `{FAST}` "
                           "leaves it out instead)")
    return report


"""Every example job file under jobs/ is a valid job.yaml (the schema the CLI checks)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.spec.load import load_spec

JOBS = sorted((Path(__file__).resolve().parents[3] / "jobs").glob("*.yaml"))


def test_there_are_example_jobs() -> None:
    assert len(JOBS) >= 5


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.name)
def test_every_example_job_validates(path: Path) -> None:
    loaded = load_spec(path)
    assert loaded.spec.name and loaded.spec.hosts
    assert (loaded.spec.train is None) != (loaded.spec.launch.command is None)

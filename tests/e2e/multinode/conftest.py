"""A two-node cluster in network namespaces, shared by the multi-node tests."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.support.netns import Cluster, start_cluster
from tests.support.tiers import needs


@pytest.fixture(scope="session")
@needs("netns")
def cluster() -> Cluster:
    c = start_cluster(Path(tempfile.mkdtemp(prefix="orch-cluster-")))
    yield c
    c.teardown()

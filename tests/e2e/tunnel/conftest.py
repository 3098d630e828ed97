"""The tunnel tests' fixtures: a folder served over HTTP on loopback, and (the fault tests' own)
host `flaky` through a proxy that cuts links (tests/support/proxy.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.e2e.faults.conftest import flaky, proxy  # noqa: F401 - fixtures, shared by being imported here
from tests.support.tunnel import Served


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = Served(tmp_path / "served", f"tunnel-token-{tmp_path.name}")
    yield s
    s.close()

"""Session fixture for the trainer tests: the tiny assets, built once (see trainer_helpers.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.support.trainer import make_tiny_assets


@pytest.fixture(scope="session")
def assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-gpt2/, data/{train,eval,text}.jsonl, plus tiny-gpt2-nodrop/ (dropout 0, for exact comparisons)."""
    dest = tmp_path_factory.mktemp("assets") / "assets"
    make_tiny_assets(dest)
    nodrop = dest / "tiny-gpt2-nodrop"
    shutil.copytree(dest / "tiny-gpt2", nodrop)
    config = json.loads((nodrop / "config.json").read_text())
    config.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    (nodrop / "config.json").write_text(json.dumps(config))
    return dest

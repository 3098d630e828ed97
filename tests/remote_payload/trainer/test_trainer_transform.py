"""data.transform: a workspace function that drops and duplicates examples does so the same way
every time (its random.Random is seeded per example), under real torchrun too; what goes wrong
in it names the example's file:line."""

from __future__ import annotations

import json
import random
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from remote_payload.contract.train_config import TrainConfig, TrainSetupError
from remote_payload.trainer import data, transform
from tests.support.trainer import base_config, run

AUGMENT = textwrap.dedent('''
    def augment(example, rng):
        """Drop about a quarter, duplicate about a quarter (a shouted copy)."""
        draw = rng.random()
        if draw < 0.25:
            return None
        if draw < 0.5:
            return [example, dict(example, output=example["output"].upper() + "!")]
        return example


    def broken(example, rng):
        if example["output"] == BAD:
            raise ValueError("cannot augment this one")
        return example


    def wrong(example, rng):
        return "not an example"


    def fieldless(example, rng):
        return {"instruction": example["instruction"]}
''')


@pytest.fixture
def workspace(assets: Path, tmp_path: Path) -> Iterator[Path]:
    """A workspace with the augment module (module-level BAD: the 7th line's output); the test's
    imports of it are forgotten afterwards."""
    ws = tmp_path / "ws"
    (ws / "aug").mkdir(parents=True)
    bad = json.loads((assets / "data" / "train.jsonl").read_text().splitlines()[6])["output"]
    (ws / "aug" / "__init__.py").write_text("")
    (ws / "aug" / "ops.py").write_text(f"BAD = {bad!r}\n" + AUGMENT)
    yield ws
    for name in [n for n in sys.modules if n == "aug" or n.startswith("aug.")]:
        del sys.modules[name]
    if str(ws.resolve()) in sys.path:
        sys.path.remove(str(ws.resolve()))


def expected_kept(path: Path, seed: int) -> int:
    """How many examples augment makes of `path` with `seed` (its rule, replayed)."""
    n = 0
    for lineno in range(1, len(path.read_text().splitlines()) + 1):
        draw = random.Random(f"{seed}:0:{lineno}").random()
        n += 0 if draw < 0.25 else 2 if draw < 0.5 else 1
    return n


def test_a_transform_drops_and_duplicates_deterministically(assets: Path, workspace: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(assets / "tiny-gpt2")
    path = assets / "data" / "train.jsonl"
    fn = transform.load("aug.ops:augment", workspace)
    once = data.load_examples(path, "alpaca", tokenizer, 64, seed=5, transform=fn)
    again = data.load_examples(path, "alpaca", tokenizer, 64, seed=5, transform=transform.load("aug.ops:augment", workspace))
    other = data.load_examples(path, "alpaca", tokenizer, 64, seed=6, transform=fn)
    assert once == again and len(once) == expected_kept(path, 5) != 512
    assert once != other and len(other) == expected_kept(path, 6)


@pytest.mark.parametrize(("spec", "message"), [
    ("aug.ops:broken", "data/train.jsonl:7: data.transform aug.ops:broken raised ValueError: cannot augment this one"),
    ("aug.ops:wrong", "data/train.jsonl:1: data.transform aug.ops:wrong returned str"),
    ("aug.ops:fieldless", "data/train.jsonl:1: data.transform aug.ops:fieldless returned an example with missing field(s) ['output']"),
    ("aug.ops:nothing", "data.transform aug.ops:nothing: aug.ops"),
    ("aug.nope:augment", "data.transform aug.nope:augment: no module aug.nope in the workspace"),
])
def test_transform_errors_name_the_example(assets: Path, workspace: Path, spec: str, message: str) -> None:
    tokenizer = AutoTokenizer.from_pretrained(assets / "tiny-gpt2")
    with pytest.raises(TrainSetupError) as err:
        data.load_examples(assets / "data" / "train.jsonl", "alpaca", tokenizer, 64, transform=transform.load(spec, workspace))
    assert message in str(err.value)


def test_the_transform_runs_in_the_trainer(assets: Path, workspace: Path, tmp_path: Path) -> None:
    cfg = base_config(model=str(assets / "tiny-gpt2"), max_steps=2, seed=5, save_every=100,
                      data={"train": str(assets / "data" / "train.jsonl"), "max_length": 64, "transform": "aug.ops:augment"})
    TrainConfig.model_validate(cfg)
    done = run(tmp_path / "job", cfg, workspace, nproc=2)
    assert done.returncode == 0, done.stdout
    kept = expected_kept(assets / "data" / "train.jsonl", 5)
    assert f"data.transform aug.ops:augment on {assets / 'data' / 'train.jsonl'}: 512 rows -> {kept} examples" in done.stdout
    failed = run(tmp_path / "bad", dict(cfg, data=dict(cfg["data"], transform="aug.ops:broken")), workspace, nproc=None)
    assert failed.returncode == 2
    assert f"{assets / 'data' / 'train.jsonl'}:7: data.transform aug.ops:broken raised ValueError" in failed.stdout
    assert "Traceback" not in failed.stdout

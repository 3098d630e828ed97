"""Data: prompt masking, deterministic sampling, epoch order, resumable skipping, eval sharding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from remote_payload.contract.train_config import TrainSetupError
from remote_payload.trainer import data


@pytest.fixture(scope="module")
def tokenizer(assets: Path):
    return AutoTokenizer.from_pretrained(assets / "tiny-gpt2")


def test_alpaca_prompt_tokens_are_masked_and_the_answer_is_trained(tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps({"instruction": "Name the first word.", "input": "cat dog", "output": "cat"}) + "\n")
    (ex,) = data.load_examples(path, "alpaca", tokenizer, max_length=256)
    prompt = data.PROMPT.format(instruction="Name the first word.", input="cat dog")
    n_prompt = len(tokenizer(prompt)["input_ids"])
    assert ex.labels[:n_prompt] == [data.IGNORE] * n_prompt
    assert ex.labels[n_prompt:] == ex.input_ids[n_prompt:]
    assert tokenizer.decode(ex.input_ids[n_prompt:]) == "cat" + tokenizer.eos_token
    batch = data.collate([ex], tokenizer.pad_token_id)
    # targets are shifted: the first trained target is the answer's first token, predicted from the prompt's last
    assert batch.targets[0, n_prompt - 1] == ex.input_ids[n_prompt]
    assert (batch.targets[0, : n_prompt - 1] == data.IGNORE).all()
    assert batch.n_label_tokens == len(ex.input_ids) - n_prompt


def test_text_format_trains_on_every_token_and_truncates(tokenizer, assets: Path) -> None:
    examples = data.load_examples(assets / "data" / "text.jsonl", "text", tokenizer, max_length=8)
    assert all(len(e.input_ids) <= 8 and e.labels == e.input_ids for e in examples)


def test_padding_is_never_a_target(tokenizer, assets: Path) -> None:
    examples = data.load_examples(assets / "data" / "train.jsonl", "alpaca", tokenizer, max_length=64)[:8]
    batch = data.collate(examples, tokenizer.pad_token_id)
    assert ((batch.attention_mask == 0) <= (batch.targets == data.IGNORE)).all()
    assert batch.n_tokens == int(batch.attention_mask.sum())


@pytest.mark.parametrize(("sample", "expected"), [(10, 10), (0.25, 128), (100000, 512)])
def test_sample_keeps_a_deterministic_subset(tokenizer, assets: Path, sample: float, expected: int) -> None:
    path = assets / "data" / "train.jsonl"
    a = data.load_examples(path, "alpaca", tokenizer, 64, sample=sample, seed=1)
    b = data.load_examples(path, "alpaca", tokenizer, 64, sample=sample, seed=1)
    c = data.load_examples(path, "alpaca", tokenizer, 64, sample=sample, seed=2)
    assert len(a) == expected and a == b
    assert expected == 512 or a != c


def _orders(examples, **kw) -> list[list[int]]:
    return [b.input_ids[:, 0].tolist() + b.input_ids.sum(1).tolist() for b in data.train_batches(examples, pad_id=0, **kw)]


def test_set_epoch_changes_the_order_and_the_same_epoch_repeats_it(tokenizer, assets: Path) -> None:
    ex = data.load_examples(assets / "data" / "train.jsonl", "alpaca", tokenizer, 64)
    kw = dict(rank=0, world_size=2, batch_size=4, seed=42, start=0)
    assert _orders(ex, epoch=0, **kw) == _orders(ex, epoch=0, **kw)
    assert _orders(ex, epoch=0, **kw) != _orders(ex, epoch=1, **kw)


def test_starting_mid_epoch_yields_exactly_the_remaining_batches(tokenizer, assets: Path) -> None:
    ex = data.load_examples(assets / "data" / "train.jsonl", "alpaca", tokenizer, 64)
    kw = dict(rank=1, world_size=2, batch_size=4, seed=42, epoch=3)
    assert _orders(ex, start=5, **kw) == _orders(ex, start=0, **kw)[5:]


def test_ranks_see_disjoint_training_examples(tokenizer, assets: Path) -> None:
    ex = data.load_examples(assets / "data" / "train.jsonl", "alpaca", tokenizer, 64)[:64]
    tagged = [data.Example([i + 1000], [i + 1000]) for i in range(len(ex))]
    seen = [sum((b.input_ids[:, 0].tolist() for b in data.train_batches(
        tagged, rank=r, world_size=2, batch_size=4, seed=0, epoch=0, start=0, pad_id=0)), []) for r in range(2)]
    assert not set(seen[0]) & set(seen[1]) and len(seen[0]) + len(seen[1]) == 64


def test_eval_shards_cover_every_example_exactly_once() -> None:
    examples = [data.Example([i, i], [i, i]) for i in range(11)]
    seen = [int(x) for r in range(3) for b in data.eval_batches(examples, rank=r, world_size=3, batch_size=2, pad_id=0)
            for x in b.input_ids[:, 0]]
    assert sorted(seen) == list(range(11))


def test_missing_data_file_is_a_setup_error(tokenizer, tmp_path: Path) -> None:
    with pytest.raises(TrainSetupError, match="data file not found"):
        data.load_examples(tmp_path / "nope.jsonl", "alpaca", tokenizer, 64)


def test_a_bad_line_is_reported_with_its_number(tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"txt": "missing field"}\n')
    with pytest.raises(TrainSetupError, match=r"bad.jsonl:2: missing field\(s\) \['text'\]"):
        data.load_examples(path, "text", tokenizer, 64)

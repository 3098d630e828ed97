"""jsonl data → token ids → padded batches in a deterministic, resumable order.

Contracts:
- `load_examples` reads and tokenizes a whole jsonl file in memory; any problem with the file
  (missing, bad JSON, missing field) raises `TrainSetupError` naming the file and line.
- `Batch.targets` is already shifted: position i holds the label of token i + 1 (-100 where there
  is none, where the prompt is, and on padding), so the loss is one cross-entropy over the logits.
- `train_batches(..., epoch, start)` yields the same batches for the same (seed, epoch, rank,
  world size), skipping the first `start` micro-batches: that is how a resumed run continues
  mid-epoch without consuming anything else.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DistributedSampler

from remote_payload.config import DataFormat, TrainSetupError

IGNORE = -100
PROMPT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
PROMPT_NO_INPUT = "### Instruction:\n{instruction}\n\n### Response:\n"


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    labels: list[int]  # IGNORE where the token is not trained on (the prompt)


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    n_tokens: int  # non-padding input tokens
    n_label_tokens: int  # targets that count in the loss

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        return Batch(
            self.input_ids.to(device, non_blocking=nb), self.attention_mask.to(device, non_blocking=nb),
            self.targets.to(device, non_blocking=nb), self.n_tokens, self.n_label_tokens,
        )


def _read_jsonl(path: Path, fields: tuple[str, ...]) -> list[dict[str, str]]:
    if not path.is_file():
        raise TrainSetupError(f"data file not found: {path} (relative paths resolve against {Path.cwd()})")
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TrainSetupError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            missing = [k for k in fields if not isinstance(row, dict) or k not in row]
            if missing:
                raise TrainSetupError(f"{path}:{lineno}: missing field(s) {missing} for this data.format")
            rows.append(row)
    if not rows:
        raise TrainSetupError(f"data file is empty: {path}")
    return rows


def _subset(rows: list[dict[str, str]], sample: int | float | None, seed: int) -> list[dict[str, str]]:
    """A deterministic subset in file order: `sample` rows (int) or that fraction (float)."""
    if sample is None:
        return rows
    n = min(len(rows), sample) if isinstance(sample, int) else max(1, round(len(rows) * sample))
    keep = sorted(random.Random(seed).sample(range(len(rows)), n))
    return [rows[i] for i in keep]


def load_examples(
    path: str | Path, fmt: DataFormat, tokenizer: object, max_length: int,
    sample: int | float | None = None, seed: int = 0,
) -> list[Example]:
    """Read, subset and tokenize a jsonl file; every example ends with EOS and fits `max_length`."""
    rows = _subset(_read_jsonl(Path(path), ("text",) if fmt == "text" else ("instruction", "output")), sample, seed)
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []

    def tokenize(texts: list[str], special: bool = True) -> list[list[int]]:
        # Truncating here gives the same result as slicing the concatenation later, and in chunks
        # the tokenizer's per-text objects for a large file never all exist at once.
        return [ids for i in range(0, len(texts), 1024) for ids in tokenizer(
            texts[i : i + 1024], add_special_tokens=special, truncation=True, max_length=max_length)["input_ids"]]

    if fmt == "text":
        return [Example(x[:max_length], x[:max_length]) for x in (i + eos for i in tokenize([r["text"] for r in rows]))]
    prompts = [(PROMPT if r.get("input") else PROMPT_NO_INPUT).format(instruction=r["instruction"], input=r.get("input", "")) for r in rows]
    prompt_ids = tokenize(prompts)
    answer_ids = tokenize([r["output"] for r in rows], special=False)
    out = []
    for p, a in zip(prompt_ids, answer_ids):
        a = a + eos
        out.append(Example((p + a)[:max_length], ([IGNORE] * len(p) + a)[:max_length]))
    return out


def collate(examples: list[Example], pad_id: int) -> Batch:
    """Right-pad to the longest example; targets shifted by one and IGNORE on padding."""
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    targets = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    n_tokens = n_labels = 0
    for row, e in enumerate(examples):
        n = len(e.input_ids)
        ids[row, :n] = torch.tensor(e.input_ids)
        mask[row, :n] = 1
        shifted = e.labels[1:]
        targets[row, : n - 1] = torch.tensor(shifted, dtype=torch.long)
        n_tokens += n
        n_labels += sum(1 for t in shifted if t != IGNORE)
    return Batch(ids, mask, targets, n_tokens, n_labels)


def batches_per_epoch(n_examples: int, world_size: int, batch_size: int) -> int:
    """Full micro-batches each rank gets per epoch (DistributedSampler and batches drop the rest)."""
    return (n_examples // world_size) // batch_size


def train_batches(
    examples: list[Example], *, rank: int, world_size: int, batch_size: int,
    seed: int, epoch: int, start: int, pad_id: int,
) -> Iterator[Batch]:
    """This rank's shuffled micro-batches of `epoch`, from micro-batch index `start` on."""
    sampler = DistributedSampler(examples, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)
    sampler.set_epoch(epoch)
    order = list(sampler)
    for b in range(start, len(order) // batch_size):
        yield collate([examples[i] for i in order[b * batch_size : (b + 1) * batch_size]], pad_id)


def eval_batches(examples: list[Example], *, rank: int, world_size: int, batch_size: int, pad_id: int) -> Iterator[Batch]:
    """This rank's share of the eval set: every example on exactly one rank, none repeated."""
    mine = examples[rank::world_size]
    for b in range(0, len(mine), batch_size):
        yield collate(mine[b : b + batch_size], pad_id)

"""jsonl data → token ids → padded batches in a deterministic, resumable order.

Contracts:
- `load_examples` reads and tokenizes a whole jsonl file in memory; any problem with the file
  (missing, bad JSON, missing field) raises `TrainSetupError` naming the file and line. With a
  `data.transform` (transform.py) each row goes through it first, and the fields are checked on
  what it returned (naming the row's file and line). `Example.source` is the index of the
  `data.mix` source an example came from (0 without a mix); `Batch.sources` lists it per example.
- `Batch.targets` is already shifted: position i holds the label of token i + 1 (-100 where there
  is none, where the prompt is, and on padding), so the loss is one cross-entropy over the logits.
  `Batch.label_index` lists, in order, the flat positions (row-major over `targets`) whose target
  is not -100: the only positions whose logits the loss needs (computed on the host, so selecting
  them on a GPU needs no sync).
- `train_batches(..., epoch, start)` yields the same batches for the same (seed, epoch, rank,
  world size, group_by_length), skipping the first `start` micro-batches: that is how a resumed
  run continues mid-epoch without consuming anything else. Its units are examples, or packed
  rows (`pack`); either way the ranks get disjoint units and the same number of batches.
- Packed rows (`pack`, `collate_packed`): every example keeps its own token positions (restarting
  at 0) and a segment id of its own; its targets are its own shifted labels, so its last token
  has no target and nothing is learnt across a boundary. The model side (model.py) turns
  `position_ids`/`segment_ids` into attention that never crosses a segment. Padding after the
  last example is one more segment, with no targets.
"""

from __future__ import annotations

import bisect
import json
import random
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.utils.data import DistributedSampler

from remote_payload.contract.train_config import DataFormat, TrainSetupError
from remote_payload.trainer.fields import check_fields, format_fields

if TYPE_CHECKING:
    from remote_payload.trainer.transform import Transform

IGNORE = -100
PROMPT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
PROMPT_NO_INPUT = "### Instruction:\n{instruction}\n\n### Response:\n"
MEGA_BATCHES = 50  # group_by_length sorts chunks of this many global batches (as HF's LengthGroupedSampler)


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    labels: list[int]  # IGNORE where the token is not trained on (the prompt)
    source: int = 0  # the data.mix source it was drawn from (mixture.py)


@dataclass(frozen=True)
class PackedRow:
    """Examples that share one row of at most `max_length` tokens (see `pack`)."""

    examples: tuple[Example, ...]

    def __len__(self) -> int:
        return sum(len(e.input_ids) for e in self.examples)


@dataclass(frozen=True)
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor  # 1 on real tokens, 0 on padding
    targets: torch.Tensor
    n_tokens: int  # non-padding input tokens
    n_label_tokens: int  # targets that count in the loss ("useful" tokens)
    position_ids: torch.Tensor | None = None  # packed rows only: restart at 0 for every example
    segment_ids: torch.Tensor | None = None  # packed rows only: which example of the row a token is in
    label_index: torch.Tensor | None = None  # flat positions of the targets that count (see the module contract)
    sources: tuple[int, ...] = ()  # each example's data.mix source, in batch order (packed rows: every example)

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        move = lambda t: None if t is None else t.to(device, non_blocking=nb)  # noqa: E731
        return Batch(move(self.input_ids), move(self.attention_mask), move(self.targets), self.n_tokens,
                     self.n_label_tokens, move(self.position_ids), move(self.segment_ids), move(self.label_index),
                     self.sources)


def _labelled(targets: torch.Tensor) -> torch.Tensor:
    return (targets.view(-1) != IGNORE).nonzero().view(-1)


def read_rows(path: Path, fields: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """(line number, object) of every non-blank line; `fields` checked on each."""
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
            check_fields(row, fields, f"{path}:{lineno}")
            rows.append((lineno, row))
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
    sample: int | float | None = None, seed: int = 0, transform: Transform | None = None, source: int = 0,
) -> list[Example]:
    """Read, transform, subset and tokenize a jsonl file; every example ends with EOS and fits `max_length`.
    `source`: the mix source index the examples carry (and the transform's random streams use)."""
    fields = format_fields(fmt)
    rows = read_rows(Path(path), () if transform else fields)
    out = transform.apply(rows, Path(path), fields, seed, source) if transform else [r for _, r in rows]
    if not out:
        raise TrainSetupError(f"{path}: data.transform dropped every example")
    return tokenize_rows(_subset(out, sample, seed), fmt, tokenizer, max_length, source)


def tokenize_rows(rows: list[dict[str, str]], fmt: DataFormat, tokenizer: object, max_length: int,
                  source: int = 0) -> list[Example]:
    """Tokenize checked rows of `fmt` into examples of `source`."""
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []

    def tokenize(texts: list[str], special: bool = True) -> list[list[int]]:
        # Truncating here gives the same result as slicing the concatenation later, and in chunks
        # the tokenizer's per-text objects for a large file never all exist at once.
        return [ids for i in range(0, len(texts), 1024) for ids in tokenizer(
            texts[i : i + 1024], add_special_tokens=special, truncation=True, max_length=max_length)["input_ids"]]

    if fmt == "text":
        return [Example(x[:max_length], x[:max_length], source) for x in (i + eos for i in tokenize([r["text"] for r in rows]))]
    prompts = [(PROMPT if r.get("input") else PROMPT_NO_INPUT).format(instruction=r["instruction"], input=r.get("input", "")) for r in rows]
    prompt_ids = tokenize(prompts)
    answer_ids = tokenize([r["output"] for r in rows], special=False)
    out = []
    for p, a in zip(prompt_ids, answer_ids):
        a = a + eos
        out.append(Example((p + a)[:max_length], ([IGNORE] * len(p) + a)[:max_length], source))
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
    return Batch(ids, mask, targets, n_tokens, n_labels, label_index=_labelled(targets),
                 sources=tuple(e.source for e in examples))


def pack(examples: Sequence[Example], max_length: int, seed: int) -> list[PackedRow]:
    """Best-fit-decreasing packing: longest example first (ties in an order shuffled with `seed`),
    each into the open row with the least room that still fits it, else a new row. Every example
    lands in exactly one row, whole (examples are at most `max_length` long); deterministic."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    order.sort(key=lambda i: -len(examples[i].input_ids))  # stable: ties keep the shuffled order
    rows: list[list[int]] = []
    open_by_room: dict[int, deque[int]] = {}  # free tokens -> open rows with exactly that much room, oldest first
    rooms: list[int] = []  # sorted keys of open_by_room
    for i in order:
        n = len(examples[i].input_ids)
        k = bisect.bisect_left(rooms, n)
        if k < len(rooms):  # the best fit: the least room that still holds the example
            free = rooms[k]
            row = open_by_room[free].popleft()
            if not open_by_room[free]:
                del open_by_room[free], rooms[k]
        else:
            row, free = len(rows), max_length
            rows.append([])
        rows[row].append(i)
        if (left := free - n) > 0:
            if left not in open_by_room:
                bisect.insort(rooms, left)
                open_by_room[left] = deque()
            open_by_room[left].append(row)
    return [PackedRow(tuple(examples[i] for i in r)) for r in rows]


def collate_packed(rows: list[PackedRow], pad_id: int) -> Batch:
    """Concatenate each row's examples and right-pad to the longest row. Positions restart at 0
    and targets are shifted per example (each example's last token has none); padding is one
    more segment (positions 0.. again) with no targets."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    targets = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    segments = torch.zeros((len(rows), width), dtype=torch.long)
    n_tokens = n_labels = 0
    for r, row in enumerate(rows):
        at = 0
        for k, e in enumerate(row.examples):
            n = len(e.input_ids)
            ids[r, at : at + n] = torch.tensor(e.input_ids)
            targets[r, at : at + n - 1] = torch.tensor(e.labels[1:], dtype=torch.long)
            positions[r, at : at + n] = torch.arange(n)
            segments[r, at : at + n] = k
            n_labels += sum(1 for t in e.labels[1:] if t != IGNORE)
            at += n
        mask[r, :at] = 1
        positions[r, at:] = torch.arange(width - at)
        segments[r, at:] = len(row.examples)
        n_tokens += at
    return Batch(ids, mask, targets, n_tokens, n_labels, positions, segments, _labelled(targets),
                 tuple(e.source for row in rows for e in row.examples))


def batches_per_epoch(n_units: int, world_size: int, batch_size: int) -> int:
    """Full micro-batches each rank gets per epoch (DistributedSampler and batches drop the rest);
    a unit is an example, or a packed row."""
    return (n_units // world_size) // batch_size


def _grouped_batches(lengths: list[int], *, rank: int, world_size: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """This rank's micro-batches (unit indices) of `epoch`, grouped by length: the epoch's
    permutation (DistributedSampler's: `randperm` seeded with seed + epoch), cut to whole steps,
    in chunks of MEGA_BATCHES global batches sorted by length (longest first), cut into global
    batches of batch_size x world_size that are then shuffled; rank r takes every world_size-th
    unit of each global batch, so the ranks' micro-batches of a step have similar lengths."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    per_global = batch_size * world_size
    n_global = batches_per_epoch(len(lengths), world_size, batch_size)
    perm = torch.randperm(len(lengths), generator=g).tolist()[: n_global * per_global]
    chunk = per_global * MEGA_BATCHES
    perm = [i for c in range(0, len(perm), chunk) for i in sorted(perm[c : c + chunk], key=lambda i: -lengths[i])]
    groups = [perm[b * per_global : (b + 1) * per_global] for b in range(n_global)]
    return [groups[b][rank::world_size] for b in torch.randperm(n_global, generator=g).tolist()]


def train_batches(
    units: Sequence[Example] | Sequence[PackedRow], *, rank: int, world_size: int, batch_size: int,
    seed: int, epoch: int, start: int, pad_id: int, group_by_length: bool = False,
) -> Iterator[Batch]:
    """This rank's shuffled micro-batches of `epoch`, from micro-batch index `start` on.
    `units` are examples, or packed rows (then batches come from `collate_packed`)."""
    if group_by_length:
        lengths = [len(u.input_ids) if isinstance(u, Example) else len(u) for u in units]
        batches = _grouped_batches(lengths, rank=rank, world_size=world_size, batch_size=batch_size, seed=seed, epoch=epoch)
    else:
        sampler = DistributedSampler(units, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True)
        sampler.set_epoch(epoch)
        order = list(sampler)
        batches = [order[b * batch_size : (b + 1) * batch_size] for b in range(len(order) // batch_size)]
    for b in batches[start:]:
        chosen = [units[i] for i in b]
        yield collate_packed(chosen, pad_id) if isinstance(chosen[0], PackedRow) else collate(chosen, pad_id)


def eval_batches(examples: list[Example], *, rank: int, world_size: int, batch_size: int, pad_id: int) -> Iterator[Batch]:
    """This rank's share of the eval set: every example on exactly one rank, none repeated."""
    mine = examples[rank::world_size]
    for b in range(0, len(mine), batch_size):
        yield collate(mine[b : b + batch_size], pad_id)

"""`data.mix`: several training files drawn by weight into one training set.

Contracts:
- `counts(sizes, weights, strategy)` is how many examples each source contributes: a total N
  split by the normalised weights p_i with the largest-remainder rule (the counts sum to N and each
  is within one of N x p_i), N by `data.mix_strategy`:
    interleave   N = sum of the sizes (as many as the files' concatenation);
    undersample  N = min_i floor(size_i / p_i): the most that leaves every source within its
                 size, so no example repeats (datasets' stopping_strategy="first_exhausted",
                 LLaMA-Factory's interleave_under, with the expected counts made exact);
    oversample   N = max_i ceil(size_i / p_i): the least that reaches every source's size, so
                 every example is seen at least once (datasets' "all_exhausted", LLaMA-Factory's
                 interleave_over).
- `draw(sources, counts, seed)`: source i gives count_i examples: whole passes over its examples
  (count_i // size_i times each) and then count_i % size_i distinct examples chosen with
  `random.Random(f"{seed}:mix:{i}")`, in file order. The draw depends on the seed, the files and the
  weights only: every process and every resume of the run draws the same set, and the sampler
  (data.py) orders it per epoch as it orders one file's examples.
- `per_source` counts a step's examples by source (the loop sums them over the ranks into
  `Progress.mix_seen`, so a resume goes on counting); `report` is the `mix.json` record that
  `orch show` prints.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from remote_payload.contract.train_config import MixSource, MixStrategy, TrainSetupError

MIX_FILE = "mix.json"  # in the job folder, rank 0


@dataclass(frozen=True)
class Drawn:
    """What `data.mix` gave: each source's examples (after any transform) and how many were drawn."""

    sizes: tuple[int, ...]
    wanted: tuple[int, ...]


def counts(sizes: Sequence[int], weights: Sequence[float], strategy: MixStrategy) -> list[int]:
    """Examples drawn from each source (see the module contract)."""
    if any(s <= 0 for s in sizes):
        raise ValueError(f"every source needs examples: sizes {list(sizes)}")
    total_w = float(sum(weights))
    p = [w / total_w for w in weights]
    if strategy == "interleave":
        n = sum(sizes)
    elif strategy == "undersample":
        n = min(math.floor(s / q + 1e-9) for s, q in zip(sizes, p))
    else:
        n = max(math.ceil(s / q - 1e-9) for s, q in zip(sizes, p))
    exact = [n * q for q in p]
    out = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(p)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in by_remainder[: n - sum(out)]:
        out[i] += 1
    if strategy == "undersample":  # a rounding up must not exceed a source's size
        out = [min(c, s) for c, s in zip(out, sizes)]
    return out


def draw(sources: Sequence[Sequence[object]], wanted: Sequence[int], seed: int) -> list[object]:
    """Source i's `wanted[i]` items: whole passes, then a seeded choice of distinct ones (file order)."""
    out: list[object] = []
    for i, (items, n) in enumerate(zip(sources, wanted)):
        passes, rest = divmod(n, len(items))
        out.extend(x for _ in range(passes) for x in items)
        keep = sorted(random.Random(f"{seed}:mix:{i}").sample(range(len(items)), rest))
        out.extend(items[k] for k in keep)
    return out


def check_sizes(mix: Sequence[MixSource], sizes: Sequence[int], strategy: MixStrategy) -> list[int]:
    """`counts`, or a `TrainSetupError` for a source left with no example (a transform dropped them all)."""
    empty = [m.train for m, s in zip(mix, sizes) if s == 0]
    if empty:
        raise TrainSetupError(f"data.mix: no examples left in {', '.join(empty)}")
    wanted = counts(sizes, [m.weight for m in mix], strategy)
    if 0 in wanted:
        raise TrainSetupError(f"data.mix ({strategy}): {mix[wanted.index(0)].train} gets no example at its weight; "
                              "raise its weight or use mix_strategy: oversample")
    return wanted


def per_source(sources: Sequence[int], n_sources: int) -> list[int]:
    """How many of `sources` (each example's source index) are of each source."""
    out = [0] * n_sources
    for s in sources:
        out[s] += 1
    return out


def report(mix: Sequence[MixSource], strategy: MixStrategy, sizes: Sequence[int], wanted: Sequence[int],
           seen: Sequence[int], step: int) -> dict[str, object]:
    """The `mix.json` record: each source's file, format, weight, examples, drawn per epoch and trained on."""
    total_w = sum(m.weight for m in mix)
    return {"strategy": strategy, "step": step, "sources": [
        {"train": m.train, "format": m.format, "weight": m.weight, "share": m.weight / total_w, "examples": size,
         "drawn": n, "trained": int(k)} for m, size, n, k in zip(mix, sizes, wanted, seen)]}


def write_report(out: Path, record: dict[str, object]) -> None:
    """Atomically replace `out/mix.json`."""
    tmp = out / f".{MIX_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, out / MIX_FILE)

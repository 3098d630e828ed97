"""Offline data and model assets for the CPU trainer benches (bench/trainer.py, bench/scaling.py).

`build_assets`: the tiny BPE tokenizer (tools/make_tiny_assets.py), a random-init GPT-2 (MODELS)
and text lines longer than its text seq. `write_alpaca`: alpaca-style instruction rows of
realistic, right-skewed length. What is guaranteed and measured: every example's *total tokenized
length* as the built-in trainer sees it (remote_payload/trainer/data.py: the prompt template tokenized,
the output tokenized without special tokens, plus EOS) is drawn from a log-normal (median
`MEDIAN`, sigma `SIGMA`) truncated to [`MIN_LEN`, `LONGEST`] (values outside are redrawn: no spike
at the bounds), then the text is cut to that length; `length_stats` re-measures the final text.
~40 % of the examples have an `input` (as in Alpaca). Deterministic under the seed; no network.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import sys
from pathlib import Path

# The built-in trainer's templates (remote_payload/trainer/data.py, commit f309d2b); the bench's other
# implementations format prompts with these too, so every implementation sees the same text.
PROMPT = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
PROMPT_NO_INPUT = "### Instruction:\n{instruction}\n\n### Response:\n"
MIN_LEN, LONGEST = 20, 400
MEDIAN, SIGMA = 96, 0.75
INPUT_SHARE = 0.4  # fraction of examples with a non-empty input
IGNORE = -100
MAX_LEN, TEXT_SEQ = 512, 128  # the benches' max_length; the fixed length of bench/scaling.py's text rows
# name: (n_layer, n_embd, n_head, vocab (None: the tokenizer's), n_positions, text seq, text lines, sentences per line)
MODELS = {
    "bench-gpt2": (4, 256, 4, None, MAX_LEN, TEXT_SEQ, 2048, 40),  # the CPU benches (trainer.py, scaling.py)
    "gpt2-124m": (12, 768, 12, 50257, 1024, 1024, 1024, 250),  # bench/gpu.sh
    "gpt2-1b": (24, 2048, 16, 50257, 2048, 1024, 256, 250),  # bench/gpu.sh: 1.3 B parameters, GPT-2-shaped
}

_TASKS = ("Summarize the text.", "Continue the story.", "Describe the {c} {w}.", "Rewrite the text in simple words.",
          "Explain why the {w} {v} the {w2}.", "Write a short story about a {c} {w}.", "List what the {w} sees.")
_WORDS = "cat dog bird fish tree river stone cloud rain sun moon star road city house book ship train car door".split()
_COLORS = "red green blue yellow black white brown grey".split()
_VERBS = "sees likes finds follows paints carries watches builds".split()


def format_prompt(row: dict[str, str]) -> str:
    """The trainer's prompt for an alpaca row (the `input` section only when it is non-empty)."""
    template = PROMPT if row.get("input") else PROMPT_NO_INPUT
    return template.format(instruction=row["instruction"], input=row.get("input", ""))


def _target(rng: random.Random) -> int:
    while True:
        n = round(math.exp(rng.gauss(math.log(MEDIAN), SIGMA)))
        if MIN_LEN <= n <= LONGEST:
            return n


def _cut(tokenizer, text: str, n_tokens: int) -> str:
    """The prefix of `text` that ends after its first `n_tokens` tokens (at least one)."""
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return text[: offsets[max(1, min(n_tokens, len(offsets))) - 1][1]].rstrip()


def _filler(rng: random.Random, sentences: list[str], n_tokens: int) -> str:
    """Running text comfortably longer than `n_tokens` tokens, from the tiny corpus' sentences."""
    return " ".join(rng.choice(sentences) for _ in range(n_tokens // 4 + 2))


def _n_tokens(tokenizer, row: dict[str, str]) -> int:
    prompt = tokenizer(format_prompt(row))["input_ids"]
    output = tokenizer(row["output"], add_special_tokens=False)["input_ids"]
    return len(prompt) + len(output) + 1  # + EOS


def build_alpaca(tokenizer, sentences: list[str], n: int, seed: int = 0) -> list[dict[str, str]]:
    """`n` alpaca rows ({instruction, input, output}) whose lengths follow the module's distribution."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        length = _target(rng)
        task = rng.choice(_TASKS).format(c=rng.choice(_COLORS), w=rng.choice(_WORDS), w2=rng.choice(_WORDS),
                                         v=rng.choice(_VERBS))
        row = {"instruction": task, "input": "", "output": ""}
        if rng.random() < INPUT_SHARE and length >= 48:
            want = round(length * rng.uniform(0.2, 0.5))
            row["input"] = _cut(tokenizer, _filler(rng, sentences, want), want)
        base = len(tokenizer(format_prompt(row))["input_ids"]) + 1  # prompt + EOS
        room = max(1, length - base)
        row["output"] = _cut(tokenizer, _filler(rng, sentences, room), room)
        rows.append(row)
    return rows


def tokenize(rows: list[dict[str, str]], tokenizer, max_length: int) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) per row exactly as the built-in trainer builds them: prompt + output +
    EOS, labels IGNORE on the prompt, truncated to `max_length` (unshifted: HF shifts in its loss)."""
    out = []
    for row in rows:
        prompt = tokenizer(format_prompt(row))["input_ids"]
        answer = tokenizer(row["output"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        out.append(((prompt + answer)[:max_length], ([IGNORE] * len(prompt) + answer)[:max_length]))
    return out


def length_stats(lengths: list[int]) -> dict[str, float]:
    """n, min, median, mean, p90 (nearest rank) and max of the lengths."""
    ordered = sorted(lengths)
    return {"n": len(ordered), "min": ordered[0], "median": statistics.median(ordered), "mean": statistics.fmean(ordered),
            "p90": ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)], "max": ordered[-1]}


def corpus_sentences(assets: Path) -> list[str]:
    """The tiny corpus' sentences (tools/make_tiny_assets.py, under `assets/tiny`)."""
    return [json.loads(line)["text"] for line in (assets / "tiny" / "data" / "text.jsonl").read_text().splitlines()]


def write_alpaca(assets: Path, n: int, seed: int) -> tuple[Path, dict[str, float]]:
    """`assets/alpaca-<n>.jsonl` (built once, atomically, with the tokenizer in `assets/bench-gpt2`)
    and its measured length distribution (`length_stats`)."""
    from transformers import AutoTokenizer

    path = assets / f"alpaca-{n}.jsonl"
    tokenizer = AutoTokenizer.from_pretrained(assets / "bench-gpt2")
    if path.exists():
        rows = [json.loads(line) for line in path.read_text().splitlines()]
    else:
        rows = build_alpaca(tokenizer, corpus_sentences(assets), n, seed)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tmp.rename(path)
    return path, length_stats([_n_tokens(tokenizer, r) for r in rows])


def build_assets(dest: Path, name: str = "bench-gpt2") -> None:
    """The tiny tokenizer, a random-init GPT-2 of size `name` (MODELS) in `dest/name`, and
    `dest/name.jsonl`: text lines longer than the text seq (rebuilt when its MODELS entry changed)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from make_tiny_assets import make_tiny_assets

    make_tiny_assets(dest / "tiny")
    stamp, spec = json.dumps(MODELS[name]), dest / name / "bench-spec.json"
    if spec.exists() and spec.read_text() == stamp:
        return
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    n_layer, n_embd, n_head, vocab, n_pos, _, lines, per_line = MODELS[name]
    tok = AutoTokenizer.from_pretrained(dest / "tiny" / "tiny-gpt2")
    tok.model_max_length = n_pos
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab or len(tok), n_positions=n_pos, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    GPT2LMHeadModel(config).save_pretrained(dest / name)
    tok.save_pretrained(dest / name)
    rng, sentences = random.Random(0), corpus_sentences(dest)
    with (dest / f"{name}.jsonl").open("w") as f:
        for _ in range(lines):
            f.write(json.dumps({"text": " ".join(rng.choice(sentences) for _ in range(per_line))}) + "\n")
    spec.write_text(stamp)


def load_rows(assets: Path, data: str, tokenizer) -> list[tuple[list[int], list[int]]]:
    """(input_ids, labels) per example: `data` an alpaca jsonl, tokenized as the trainer does, or
    `text`: bench-gpt2.jsonl lines cut to exactly TEXT_SEQ tokens (all labels, no padding)."""
    if data != "text":
        return tokenize([json.loads(x) for x in (assets / data).read_text().splitlines()], tokenizer, MAX_LEN)
    texts = [json.loads(line)["text"] for line in (assets / "bench-gpt2.jsonl").read_text().splitlines()]
    ids = tokenizer(texts, truncation=True, max_length=TEXT_SEQ)["input_ids"]
    assert all(len(x) == TEXT_SEQ for x in ids)
    return [(x, x) for x in ids]

"""Build the tiny demo/test assets offline: a 2-layer GPT-2, a BPE tokenizer, and small datasets.

Layout under DEST::

    tiny-gpt2/          config.json, model.safetensors, tokenizer files (save_pretrained form)
    data/train.jsonl    alpaca-format instructions ({"instruction", "input", "output"})
    data/eval.jsonl     same format, disjoint examples
    data/text.jsonl     text-format lines ({"text"})
    .complete           written last; its presence means everything above is there

Everything is derived from a fixed seed, so two builds produce the same data and the same
initial weights. A DEST that already holds `.complete` is left untouched (idempotent); a partial
build is replaced. No network is used.

    python tools/make_tiny_assets.py DEST
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

SEED = 1234
EOS = "<|endoftext|>"
N_TRAIN, N_EVAL, N_TEXT = 512, 64, 512
VOCAB_SIZE = 512

_WORDS = (
    "cat dog bird fish tree river stone cloud rain sun moon star light night day road city house "
    "book song game ship train car door window table chair apple bread water fire wind snow hill"
).split()
_COLORS = "red green blue yellow black white brown grey".split()
_VERBS = "sees likes finds follows paints carries watches builds".split()


def _instruction(rng: random.Random) -> dict[str, str]:
    """One synthetic instruction with a deterministic answer a tiny model can learn."""
    kind = rng.randrange(5)
    words = rng.sample(_WORDS, rng.randint(2, 4))
    if kind == 0:
        return {"instruction": "Reverse the order of the words.", "input": " ".join(words), "output": " ".join(reversed(words))}
    if kind == 1:
        a, b = rng.randint(0, 50), rng.randint(0, 50)
        return {"instruction": f"What is {a} plus {b}?", "input": "", "output": str(a + b)}
    if kind == 2:
        return {"instruction": "Write the words in upper case.", "input": " ".join(words), "output": " ".join(words).upper()}
    if kind == 3:
        return {"instruction": "Name the first word.", "input": " ".join(words), "output": words[0]}
    color = rng.choice(_COLORS)
    return {"instruction": f"Describe a {color} {words[0]}.", "input": "", "output": f"The {words[0]} is {color} and it {rng.choice(_VERBS)} the {words[1]}."}


def _sentence(rng: random.Random) -> str:
    n = rng.randint(1, 3)
    parts = [f"the {rng.choice(_COLORS)} {rng.choice(_WORDS)} {rng.choice(_VERBS)} the {rng.choice(_WORDS)}" for _ in range(n)]
    return (", and ".join(parts) + ".").capitalize()


def _write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def _build_tokenizer(texts: list[str], dest: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2TokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=[EOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # GPT2TokenizerFast writes tokenizer_class GPT2Tokenizer: loadable by transformers 4.x and 5.x.
    fast = GPT2TokenizerFast(
        tokenizer_object=tok, eos_token=EOS, bos_token=EOS, unk_token=EOS, pad_token=EOS, model_max_length=256
    )
    fast.save_pretrained(dest)


def _build_model(vocab_size: int, eos_id: int, dest: Path) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab_size, n_positions=256, n_embd=64, n_layer=2, n_head=4,
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
    )
    torch.manual_seed(SEED)
    GPT2LMHeadModel(config).save_pretrained(dest)


def make_tiny_assets(dest: Path) -> None:
    """Create the assets under `dest` unless a complete set is already there."""
    dest = Path(dest)
    if (dest / ".complete").exists():
        return
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "data").mkdir(parents=True)

    rng = random.Random(SEED)
    examples = [_instruction(rng) for _ in range(N_TRAIN + N_EVAL)]
    texts = [{"text": _sentence(rng)} for _ in range(N_TEXT)]
    _write_jsonl(tmp / "data" / "train.jsonl", examples[:N_TRAIN])
    _write_jsonl(tmp / "data" / "eval.jsonl", examples[N_TRAIN:])
    _write_jsonl(tmp / "data" / "text.jsonl", texts)

    corpus = [f"### Instruction:\n{e['instruction']}\n\n### Input:\n{e['input']}\n\n### Response:\n{e['output']}" for e in examples]
    corpus += [t["text"] for t in texts]
    _build_tokenizer(corpus, tmp / "tiny-gpt2")

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tmp / "tiny-gpt2")
    _build_model(len(tokenizer), tokenizer.eos_token_id, tmp / "tiny-gpt2")
    (tmp / ".complete").write_text("ok\n")

    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(dest)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tools/make_tiny_assets.py DEST")
    make_tiny_assets(Path(sys.argv[1]))

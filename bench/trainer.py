"""Trainer throughput: remote_payload.train vs Hugging Face `Trainer` vs a bare PyTorch loop.

    python bench/trainer.py [--steps 30] [--warmup 10] [--repeat 3] [--modes full,lora] [--layouts 1x1,1x2,2x1]

Same model (GPT-2 config, 4 layers x 256, random init, the tiny BPE tokenizer), same data (text
lines of >= 128 tokens, truncated to exactly 128: no padding anywhere), batch 8 per process,
fp32, AdamW. Every implementation runs under torchrun (gloo on CPU) with OMP_NUM_THREADS set
explicitly; a layout PxT is P processes with T threads each. Throughput counts input tokens over
all processes in the steps after `--warmup`; peak RSS is rank 0's. Prints a markdown table with
ratios (ours / Trainer, ours / bare loop). Not a test: machines are noisy, read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEQ, BATCH = 128, 8
LORA = {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": ["c_attn"]}


# name: (n_layer, n_embd, n_head, vocab_size (None: the tokenizer's), seq, data lines, sentences per line)
MODELS = {
    "bench-gpt2": (4, 256, 4, None, SEQ, 2048, 40),  # this script's CPU comparison
    "gpt2-124m": (12, 768, 12, 50257, 1024, 1024, 250),  # bench/gpu.sh
}


def build_assets(dest: Path, name: str = "bench-gpt2") -> None:
    """The tiny tokenizer, a random-init GPT-2 of size `name` (MODELS) in `dest/name`, and
    `dest/name.jsonl`: text lines longer than the model's sequence length."""
    sys.path.insert(0, str(REPO / "tools"))
    from make_tiny_assets import make_tiny_assets

    make_tiny_assets(dest / "tiny")
    if (dest / name / "config.json").exists():
        return
    import random

    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    n_layer, n_embd, n_head, vocab, seq, lines, per_line = MODELS[name]
    tok = AutoTokenizer.from_pretrained(dest / "tiny" / "tiny-gpt2")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab or len(tok), n_positions=seq, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(dest / name)
    tok.save_pretrained(dest / name)
    sentences = [json.loads(line)["text"] for line in (dest / "tiny" / "data" / "text.jsonl").read_text().splitlines()]
    rng = random.Random(0)
    with (dest / f"{name}.jsonl").open("w") as f:
        for _ in range(lines):
            f.write(json.dumps({"text": " ".join(rng.choice(sentences) for _ in range(per_line))}) + "\n")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _examples(assets: Path, tokenizer) -> list[list[int]]:
    texts = [json.loads(line)["text"] for line in (assets / "bench-gpt2.jsonl").read_text().splitlines()]
    ids = tokenizer(texts, truncation=True, max_length=SEQ)["input_ids"]
    assert all(len(x) == SEQ for x in ids)
    return ids


def _model(assets: Path, mode: str):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(assets / "bench-gpt2", dtype=torch.float32)
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                                                 target_modules=LORA["target_modules"], task_type="CAUSAL_LM"))
    model.train()
    return model


def worker_bare(assets: Path, mode: str, steps: int, warmup: int, out: Path) -> None:
    """The floor: DDP (when world > 1), HF's own loss, AdamW (no weight decay), clipping at 1.0, nothing else."""
    import torch
    import torch.distributed as dist
    from transformers import AutoTokenizer

    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    if world > 1:
        dist.init_process_group("gloo")
    tok = AutoTokenizer.from_pretrained(assets / "bench-gpt2")
    data = torch.tensor(_examples(assets, tok))
    torch.manual_seed(0)
    raw = _model(assets, mode)
    model = torch.nn.parallel.DistributedDataParallel(raw, find_unused_parameters=False, gradient_as_bucket_view=True) if world > 1 else raw
    params = [p for p in raw.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=2e-4, weight_decay=0.0)
    t0 = time.perf_counter()
    for step in range(steps):
        if step == warmup:
            t0 = time.perf_counter()
        start = ((step * world + rank) * BATCH) % (len(data) - BATCH)
        batch = data[start : start + BATCH]
        model(input_ids=batch, labels=batch, use_cache=False).loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)  # as ours and Trainer (max_grad_norm 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - t0
    if rank == 0:
        out.write_text(json.dumps({"tokens_per_s": (steps - warmup) * BATCH * SEQ * world / elapsed, "peak_rss_mb": peak_rss_mb()}))
    if world > 1:
        dist.destroy_process_group()


def worker_hf(assets: Path, mode: str, steps: int, warmup: int, out: Path) -> None:
    """Hugging Face `Trainer` with its defaults (no saving, no reporting)."""
    import torch
    from transformers import AutoTokenizer, Trainer, TrainerCallback, TrainingArguments, default_data_collator

    tok = AutoTokenizer.from_pretrained(assets / "bench-gpt2")
    rows = [{"input_ids": x, "labels": x, "attention_mask": [1] * SEQ} for x in _examples(assets, tok)]
    world = int(os.environ.get("WORLD_SIZE", 1))
    marks: dict[int, float] = {}

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            marks[state.global_step] = time.perf_counter()

    torch.manual_seed(0)
    args = TrainingArguments(
        output_dir=str(out.parent / "hf-out"), per_device_train_batch_size=BATCH, max_steps=steps, learning_rate=2e-4,
        warmup_steps=0, logging_steps=10**9, save_strategy="no", report_to=[], use_cpu=True,
        dataloader_num_workers=0, disable_tqdm=True, seed=0,
    )
    trainer = Trainer(model=_model(assets, mode), args=args, train_dataset=rows, data_collator=default_data_collator,
                      callbacks=[Clock()])
    trainer.train()
    if int(os.environ.get("RANK", 0)) == 0:
        elapsed = marks[steps] - marks[warmup]
        out.write_text(json.dumps({"tokens_per_s": (steps - warmup) * BATCH * SEQ * world / elapsed, "peak_rss_mb": peak_rss_mb()}))


def _torchrun(nproc: int, threads: int, tail: list[str], cwd: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO),
           "TOKENIZERS_PARALLELISM": "false"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), *tail]
    result = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        sys.exit(f"failed: {' '.join(argv)}\n{result.stdout[-3000:]}")


def run_ours(assets: Path, mode: str, nproc: int, threads: int, steps: int, warmup: int, work: Path) -> dict:
    out = work / f"ours-{mode}-{nproc}x{threads}"
    out.mkdir(parents=True)
    cfg = {"model": "bench-gpt2", "finetune": mode, "lora": LORA if mode == "lora" else None,
           "data": {"train": "bench-gpt2.jsonl", "format": "text", "max_length": SEQ}, "precision": "fp32",
           "batch_size": BATCH, "max_steps": steps, "lr": 2e-4, "warmup_steps": 0, "log_every": warmup,
           "save_every": 10**6, "eval_every": 10**6}
    (out / "train.json").write_text(json.dumps(cfg))
    _torchrun(nproc, threads, ["-m", "remote_payload.train", "--config", str(out / "train.json"), "--out", str(out)], assets)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line][1:]
    tokens = sum(r["tokens_per_s"] * r["interval_s"] for r in rows)
    return {"tokens_per_s": tokens / sum(r["interval_s"] for r in rows), "peak_rss_mb": max(r["peak_mem_mb"] for r in rows)}


def run_worker(kind: str, assets: Path, mode: str, nproc: int, threads: int, steps: int, warmup: int, work: Path) -> dict:
    work.mkdir(parents=True, exist_ok=True)
    out = work / f"{kind}-{mode}-{nproc}x{threads}.json"
    _torchrun(nproc, threads, [__file__, "--worker", kind, "--assets", str(assets), "--mode", mode, "--steps", str(steps),
                               "--warmup", str(warmup), "--result", str(out)], assets)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--modes", default="full,lora")
    parser.add_argument("--layouts", default="1x1,1x2,2x1", help="PROCESSESxTHREADS, comma-separated")
    parser.add_argument("--repeat", type=int, default=3, help="runs per implementation; the best is reported")
    parser.add_argument("--assets", type=Path, default=Path(tempfile.gettempdir()) / "orch-bench-trainer-assets")
    parser.add_argument("--build", choices=sorted(MODELS), help="only build that model and its data under --assets")
    parser.add_argument("--worker", choices=["bare", "hf"], help=argparse.SUPPRESS)
    parser.add_argument("--mode", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        {"bare": worker_bare, "hf": worker_hf}[args.worker](args.assets, args.mode, args.steps, args.warmup, args.result)
        return
    if args.build:
        build_assets(args.assets, args.build)
        return
    build_assets(args.assets)
    import torch

    print(f"# trainer throughput, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
          f"GPT-2 4x256, seq {SEQ}, batch {BATCH}/process, fp32, {args.steps} steps ({args.warmup} warm-up), "
          f"best of {args.repeat} interleaved runs\n")
    print("| mode | procs x threads | ours tok/s | Trainer tok/s | bare tok/s | ours/Trainer | ours/bare | RSS MB ours/Trainer/bare |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            for layout in args.layouts.split(","):
                nproc, threads = map(int, layout.split("x"))
                work = Path(tmp) / f"{mode}-{layout}"
                results: dict[str, list[dict]] = {"ours": [], "hf": [], "bare": []}
                for rep in range(args.repeat):  # interleaved, so a burst of load hits all three alike
                    rep_dir = work / str(rep)
                    results["ours"].append(run_ours(args.assets, mode, nproc, threads, args.steps, args.warmup, rep_dir))
                    for kind in ("hf", "bare"):
                        results[kind].append(run_worker(kind, args.assets, mode, nproc, threads, args.steps, args.warmup, rep_dir))
                ours, hf, bare = (max(results[k], key=lambda r: r["tokens_per_s"]) for k in ("ours", "hf", "bare"))
                print(f"| {mode} | {nproc} x {threads} | {ours['tokens_per_s']:.0f} | {hf['tokens_per_s']:.0f} | "
                      f"{bare['tokens_per_s']:.0f} | {ours['tokens_per_s'] / hf['tokens_per_s']:.2f} | "
                      f"{ours['tokens_per_s'] / bare['tokens_per_s']:.2f} | "
                      f"{ours['peak_rss_mb']:.0f}/{hf['peak_rss_mb']:.0f}/{bare['peak_rss_mb']:.0f} |", flush=True)


if __name__ == "__main__":
    main()

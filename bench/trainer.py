"""Useful tokens/s of fine-tuning on variable-length instruction data: remote_payload.train
(its defaults; packed; padded) vs a bare PyTorch loop vs Hugging Face `Trainer` (its default, its
length grouping, its padding-free flattening) vs TRL `SFTTrainer` (padding-free packing).

    python bench/trainer.py [--steps 8] [--warmup 2] [--trl-steps 3] [--repeat 5] [--layouts 1x1,2x1] [--repo PATH]
    python bench/trainer.py --impls all        # every row below, not only the goal's (FINAL)
    python bench/trainer.py --device cuda --model gpt2-124m --layouts 1x4 --impls ours,ours-pack,hf-group,hf-flat,trl

`ours` is the trainer with its defaults (length-grouped batches, logits only at labelled
positions, freed CPU memory kept); `ours-pack` adds `data.packing`; `ours-pad` turns grouping off
(a plain shuffle, padding per batch); `ours-all` is `ours` with `logits: all` (every position's
logits, as the others compute them). The goal: `ours` >= 1.3x the best anchor row (ANCHORS).

Anchors at their best documented settings: `hf` is `Trainer` at its defaults (random order, padding
per batch); `hf-group` adds `train_sampling_strategy="group_by_length"` (transformers 5's name for
`group_by_length=True`: LengthGroupedSampler); `hf-flat` feeds `DataCollatorWithFlattening` (each
batch one padding-free row with restarting position_ids: flash-attention varlen on a GPU with
flash_attn, sdpa with the block mask transformers derives from the position ids otherwise);
`trl` is SFTTrainer's padding-free packing. All use the fused AdamW (HF's default since torch 2.8);
`--hf-compile` adds `torch_compile=True` to the Trainer rows (TRL's too). On a GPU (`--device
cuda`) every implementation runs bf16 autocast, the others fp32.

Measured: USEFUL tokens/s = non-padding input tokens of the batches consumed in the steps after the
warm-up, summed over processes, / rank 0's wall time of those steps. Every implementation counts
the batches it actually fed to the model (ours: metrics.jsonl rows after the warm-up, weighted by
interval_s). Also label tokens/s (tokens with a loss), padding % (share of computed positions that
are padding) and peak RSS (max over all processes of a run, torchrun's agent included:
getrusage(RUSAGE_CHILDREN) of a wrapper). Cells: median (min-max) of `--repeat` interleaved rounds,
each running every cell once in a rotated order. Data: alpaca-style, built offline
(bench/alpaca_data.py), 20-400 tokens, log-normal. Model: GPT-2 4 layers x 256 (n_positions 512),
random init (`--model`), the tiny BPE tokenizer; fp32 (bf16 on a GPU), batch 8/process, max_length 512, lr 2e-4, clip 1.0,
seed 42, fused AdamW, torchrun (gloo), OMP_NUM_THREADS set; layout PxT = P processes x T threads.
TRL's padding-free steps are ~8x slower on CPU, so it runs `--trl-steps` (1 warm-up): its timed
window is still the longest in seconds. Not a test: read the ratios.

`--epoch`: each layout's data is exactly `--steps` x processes x batch examples, so every
implementation that feeds one example per row (all but `ours-pack` and `trl`) trains on the same
examples, each once, and its timed window holds all of them but its warm-up steps'. Without it the
data is larger than a run and each sampler puts other examples in the window: a token's cost
rises with its sequence's length, so the rows then compare different work (measured 2026-12-02:
the windows of `ours` and `hf-group` held examples of 132 and 183 tokens on average at 1x1, 171
and 123 at 2x1). Use it with a long run: from `--steps 200` (1,600 examples per process) on,
`Trainer`'s length grouping sorts chunks of 50 batches as ours does; on shorter epochs its chunks
shrink (min(examples / (4 x batch), 50) batches) and it pads more (measured: 19 % at 192
examples, 11 % at 384, 2.7 % at 1,600 like ours).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import alpaca_data  # noqa: E402
from alpaca_data import MAX_LEN, MODELS, TEXT_SEQ, build_assets, load_rows  # noqa: E402

BATCH, LR, SEED = 8, 2e-4, 42
LORA = {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": ["c_attn"]}
IMPLS = ("ours", "ours-pack", "ours-pad", "ours-all", "bare", "hf", "hf-group", "hf-flat", "trl")
ANCHORS = ("hf", "hf-group", "hf-flat", "trl")  # the rows the goal (ours >= 1.3x the best) is measured against
FINAL = ("ours", "bare", "hf-group", "hf-flat", "trl")  # the default --impls: the goal's table, ~15 min at 3 rounds
WORKERS = ("bare", *ANCHORS)
# the train: options of each of our rows, on top of the trainer's defaults
OURS = {"ours": {}, "ours-pack": {"data": {"packing": True}}, "ours-pad": {"data": {"group_by_length": False}},
        "ours-all": {"logits": "all"}}
# Runs torchrun, then writes the max RSS (MiB) of all its descendants (agent and ranks).
_WRAP = ("import json, resource, subprocess, sys; rc = subprocess.run(sys.argv[2:]).returncode; open(sys.argv[1], 'w')"
         ".write(json.dumps(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)); sys.exit(rc)")


def _model(a: argparse.Namespace, attn: str | None = None, device: str = "cpu"):
    """The bench GPT-2 (`a.model`) in fp32 on `device`, seeded, LoRA-wrapped for mode lora, in train
    mode (dropout on, as in ours); `attn` an attn_implementation (None: transformers' default)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(SEED)
    extra = {"attn_implementation": attn} if attn else {}
    model = AutoModelForCausalLM.from_pretrained(a.assets / a.model, dtype=torch.float32, **extra)
    mode = a.mode
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=LORA["dropout"],
                                                 target_modules=LORA["target_modules"], task_type="CAUSAL_LM"))
    model.train()
    return model.to(device)


def _count(inputs: dict) -> list[int]:
    """[non-padding input tokens, label tokens (after HF's shift), computed positions] of a batch."""
    ids, mask = inputs["input_ids"], inputs.get("attention_mask")
    return [int(mask.sum()) if mask is not None else ids.numel(), int((inputs["labels"][..., 1:] != -100).sum()), ids.numel()]


def _write(out: Path, counts: list[int], elapsed: float, extra: dict | None = None) -> None:
    record = {"tokens": counts[0], "labels": counts[1], "slots": counts[2], "elapsed": elapsed, **(extra or {})}
    out.with_name(f"{out.name}.rank{os.environ.get('RANK', '0')}").write_text(json.dumps(record))


def worker_bare(a: argparse.Namespace) -> None:
    """The floor: DDP when world > 1 (find_unused_parameters=False), HF's own loss (labels -100 on
    prompt and padding), the HF collator's per-batch padding and attention mask, fused AdamW without
    weight decay, clipping at 1.0. Batches: a seeded permutation, each rank a disjoint share."""
    import torch
    import torch.distributed as dist
    from transformers import AutoTokenizer, DataCollatorForSeq2Seq

    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    cuda = a.device == "cuda"
    device = f"cuda:{os.environ.get('LOCAL_RANK', 0)}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
    tok = AutoTokenizer.from_pretrained(a.assets / a.model)
    rows, collate = load_rows(a.assets, a.data, tok), DataCollatorForSeq2Seq(tok, label_pad_token_id=-100)
    raw = _model(a, device=device)
    model = torch.nn.parallel.DistributedDataParallel(raw, gradient_as_bucket_view=True) if world > 1 else raw
    params = [p for p in raw.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0, fused=True)
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(SEED)).tolist()
    counts, t0 = [0, 0, 0], time.perf_counter()
    for step in range(a.steps):
        if step == a.warmup:
            counts, t0 = [0, 0, 0], time.perf_counter()
        first = (step * world + rank) * BATCH
        picked = [rows[order[i % len(rows)]] for i in range(first, first + BATCH)]
        batch = collate([{"input_ids": ids, "labels": labels} for ids, labels in picked]).to(device)
        with torch.autocast("cuda", torch.bfloat16, enabled=cuda):
            loss = model(**batch, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        counts = [c + n for c, n in zip(counts, _count(batch))]
    if cuda:
        torch.cuda.synchronize()
    _write(a.result, counts, time.perf_counter() - t0)
    if world > 1:
        dist.destroy_process_group()


def _hf_train(a: argparse.Namespace, trainer_cls, args, probe=None, attn: str | None = None, **kwargs) -> None:
    """Train with `trainer_cls` (Trainer or SFTTrainer), counting every batch as fed to the model
    (training_step) and timing steps warmup+1..steps (on_step_end); `probe(model)` goes in the result."""
    from transformers import TrainerCallback

    seen: list[list[int]] = []
    marks: dict[int, float] = {}

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if a.device == "cuda":
                import torch

                torch.cuda.synchronize()
            marks[state.global_step] = time.perf_counter()

    class Counting(trainer_cls):
        def training_step(self, model, inputs, *rest, **kw):
            seen.append(_count(inputs))
            return super().training_step(model, inputs, *rest, **kw)

    trainer = Counting(model=_model(a, attn), args=args, callbacks=[Clock()], **kwargs)  # Trainer places it
    trainer.train()
    assert len(seen) == a.steps, (len(seen), a.steps)
    extra = {"attn": trainer.model.config._attn_implementation, "padding_free": getattr(trainer, "padding_free", None),
             "packing_strategy": getattr(args, "packing_strategy", None) if getattr(args, "packing", False) else None,
             "completion_only_loss": getattr(trainer, "completion_only_loss", None),
             "isolation": probe(trainer.model) if probe else None}
    _write(a.result, [sum(c[i] for c in seen[a.warmup:]) for i in range(3)], marks[a.steps] - marks[a.warmup], extra)
    import torch.distributed as dist

    if dist.is_initialized():  # left open, gloo may abort the process at exit
        dist.barrier()
        dist.destroy_process_group()


def _common_args(a: argparse.Namespace) -> dict:
    """TrainingArguments shared by Trainer and SFTTrainer; fp32 on a CPU spelled out (SFTConfig
    defaults to bf16=True, which is bf16 autocast on a CPU too), bf16 on a GPU; `torch_compile` with
    --hf-compile; HF defaults otherwise (fused AdamW, linear schedule, DDP find_unused_parameters=True
    for these models); no saving or reporting."""
    cuda = a.device == "cuda"
    return dict(output_dir=str(a.result.parent / "hf-out"), per_device_train_batch_size=BATCH, max_steps=a.steps,
                learning_rate=LR, warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, logging_steps=10**9, bf16=cuda,
                fp16=False, save_strategy="no", report_to=[], use_cpu=not cuda, dataloader_num_workers=0,
                disable_tqdm=True, seed=SEED, torch_compile=a.hf_compile)


def _flash_or_none(a: argparse.Namespace) -> str | None:
    """flash_attention_2 on a GPU with flash_attn installed (varlen for flattened rows), else None."""
    return "flash_attention_2" if a.device == "cuda" and importlib.util.find_spec("flash_attn") else None


def worker_hf(a: argparse.Namespace) -> None:
    """Hugging Face `Trainer`. `hf`: defaults, padding per batch with DataCollatorForSeq2Seq (labels
    -100 on pads); `hf-group`: the same with train_sampling_strategy="group_by_length"; `hf-flat`:
    DataCollatorWithFlattening (one padding-free row per batch, position_ids restarting per example,
    the first label of each example -100; flash-attention kwargs precomputed when flash_attn runs)."""
    from transformers import AutoTokenizer, DataCollatorForSeq2Seq, DataCollatorWithFlattening, Trainer, TrainingArguments

    tok = AutoTokenizer.from_pretrained(a.assets / a.model)
    rows = [{"input_ids": i, "labels": lab} for i, lab in load_rows(a.assets, a.data, tok)]
    args, attn = _common_args(a), None
    if a.worker == "hf-group":  # transformers 5's name; before it, group_by_length=True
        import dataclasses

        names = {f.name for f in dataclasses.fields(TrainingArguments)}
        args.update({"train_sampling_strategy": "group_by_length"} if "train_sampling_strategy" in names
                    else {"group_by_length": True})
    if a.worker == "hf-flat":
        attn = _flash_or_none(a)
        collator = DataCollatorWithFlattening(return_flash_attn_kwargs=attn is not None)
        args["remove_unused_columns"] = False
    else:
        collator = DataCollatorForSeq2Seq(tok, label_pad_token_id=-100)
    probe = (lambda model: _isolation(model, tok)) if a.worker == "hf-flat" else None
    _hf_train(a, Trainer, TrainingArguments(**args), probe=probe, attn=attn, train_dataset=rows, data_collator=collator)


def worker_trl(a: argparse.Namespace) -> None:
    """TRL `SFTTrainer`, its own packing (SFTConfig(packing=True, max_length=512), TRL's default
    strategy) on prompt/completion rows in the trainer's template: completion_only_loss masks prompts."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tok = AutoTokenizer.from_pretrained(a.assets / a.model)
    rows = [json.loads(line) for line in (a.assets / a.data).read_text().splitlines()]
    data = Dataset.from_list([{"prompt": alpaca_data.format_prompt(r), "completion": r["output"]} for r in rows])
    _hf_train(a, SFTTrainer, SFTConfig(**_common_args(a), packing=True, max_length=MAX_LEN), train_dataset=data,
              processing_class=tok, attn=_flash_or_none(a), probe=lambda model: _isolation(model, tok))


def _isolation(model, tok) -> float:
    """Max |logit difference| of an example packed behind another as TRL's padding-free collator
    feeds it (one row, restarting position_ids, no mask, use_cache=False as its compute_loss) vs the
    example alone: ~1e-6 = isolated (transformers derives a block mask from the position_ids)."""
    import torch

    first, second = tok(" ".join(["The red cat sees the dog."] * 4))["input_ids"], tok("A blue bird.")["input_ids"]
    device = next(model.parameters()).device
    positions = torch.tensor([list(range(len(first))) + list(range(len(second)))], device=device)
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda"):
        packed = model(input_ids=torch.tensor([first + second], device=device), position_ids=positions, use_cache=False).logits
        alone = model(input_ids=torch.tensor([second], device=device), use_cache=False).logits
        return float((packed[0, len(first):] - alone[0]).abs().max())


def torchrun(layout: str, tail: list[str], cwd: Path, repo: Path, log: Path) -> float:
    """`torchrun --standalone` P processes with OMP_NUM_THREADS=T (layout PxT) and PYTHONPATH=repo
    (whose remote_payload runs), output to `log`; returns the run's peak RSS in MiB."""
    nproc, threads = layout.split("x")
    env = {**os.environ, "OMP_NUM_THREADS": threads, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": str(repo), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", nproc, *tail]
    with log.open("w") as f:
        rc = subprocess.run([sys.executable, "-c", _WRAP, str(log.with_suffix(".rss")), *argv], cwd=cwd, env=env,
                            stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise RuntimeError(f"failed: {' '.join(argv)}\n{log.read_text()[-3000:]}")
    return json.loads(log.with_suffix(".rss").read_text())


def run_ours(kind: str, assets: Path, data: str, mode: str, layout: str, steps: int, warmup: int, work: Path, repo: Path,
             model: str = "bench-gpt2", device: str = "cpu", hf_compile: bool = False) -> dict:
    """One run of `repo`'s remote_payload.train (`kind` in OURS); rates from metrics.jsonl rows
    after warm-up. bf16 on a GPU (the trainer picks flash-attention varlen for packed rows when
    flash_attn is installed), fp32 on a CPU; `hf_compile` is the anchors' option and ignored here."""
    out = Path(tempfile.mkdtemp(prefix=f"{kind}-{mode}-{layout}-", dir=work))
    text = data == "text"
    precision = "bf16" if device == "cuda" else "fp32"
    cfg = {"model": model, "finetune": mode, "lora": LORA if mode == "lora" else None, "precision": precision,
           "data": {"train": "bench-gpt2.jsonl" if text else data, "format": "text" if text else "alpaca",
                    "max_length": TEXT_SEQ if text else MAX_LEN, **OURS[kind].get("data", {})},
           **{k: v for k, v in OURS[kind].items() if k != "data"}, "batch_size": BATCH, "max_steps": steps, "lr": LR, "warmup_steps": 0, "seed": SEED, "max_grad_norm": 1.0,
           "log_every": warmup, "save_every": 10**6, "eval_every": 10**6}
    (out / "train.json").write_text(json.dumps(cfg))
    rss = torchrun(layout, ["-m", "remote_payload.train", "--config", str(out / "train.json"), "--out", str(out)],
                   assets, repo, out / "log.txt")
    rows = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r and r["step"] > warmup]
    seconds = sum(r["interval_s"] for r in rows)
    tokens = sum(r["tokens_per_s"] * r["interval_s"] for r in rows)
    slots = sum(r["tokens_per_s"] * r["interval_s"] / max(1e-9, 1 - r["padding_fraction"]) for r in rows)
    return {"tokens_per_s": tokens / seconds, "labels_per_s": sum(r["label_tokens_per_s"] * r["interval_s"] for r in rows) / seconds,
            "padding": 1 - tokens / slots, "rss_mb": rss, "log": out / "log.txt",
            "note": next((ln.split("INFO ")[-1] for ln in (out / "log.txt").read_text().splitlines() if "INFO packing" in ln), None)}


def run_worker(kind: str, assets: Path, data: str, mode: str, layout: str, steps: int, warmup: int, work: Path, repo: Path,
               model: str = "bench-gpt2", device: str = "cpu", hf_compile: bool = False) -> dict:
    """One torchrun of this file's `worker_<kind>`: the ranks' counts summed, over rank 0's timed window."""
    out = Path(tempfile.mkdtemp(prefix=f"{kind}-{mode}-{layout}-", dir=work)) / "result"
    rss = torchrun(layout, [__file__, "--worker", kind, "--assets", str(assets), "--data", data, "--mode", mode, "--steps",
                            str(steps), "--warmup", str(warmup), "--result", str(out), "--model", model, "--device", device,
                            *(["--hf-compile"] if hf_compile else [])], assets, repo, out.with_name("log.txt"))
    ranks = [json.loads(out.with_name(f"result.rank{r}").read_text()) for r in range(int(layout.split("x")[0]))]
    total, elapsed = {k: sum(r[k] for r in ranks) for k in ("tokens", "labels", "slots")}, ranks[0]["elapsed"]
    return {"tokens_per_s": total["tokens"] / elapsed, "labels_per_s": total["labels"] / elapsed, "rss_mb": rss,
            "padding": 1 - total["tokens"] / total["slots"], "log": out.with_name("log.txt"), "info": ranks[0]}


def run_impl(kind: str, *args, **options) -> dict:
    """`run_ours` or `run_worker` by kind, with the same arguments; adds `wall_s`."""
    t0 = time.perf_counter()
    result = (run_ours if kind in OURS else run_worker)(kind, *args, **options)
    return {**result, "wall_s": time.perf_counter() - t0}


def spread(values: list[float], fmt: str = "{:,.0f}") -> str:
    """'median (min–max)' of `values` (one value: just it)."""
    med = fmt.format(statistics.median(values))
    return med if len(values) == 1 else f"{med} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def rotations(cells: list, rounds: int) -> list[list]:
    """Each round's order of `cells`: rotated so that every round starts elsewhere."""
    step = max(1, len(cells) // max(1, rounds))
    return [cells[(r * step) % len(cells):] + cells[: (r * step) % len(cells)] for r in range(rounds)]


def header(repo: Path) -> str:
    """Date, cores, load average, package versions, which checkout's trainer runs."""
    from importlib.metadata import distributions

    have = {d.metadata["Name"].lower(): d.version for d in distributions()}
    return (f"{time.strftime('%Y-%m-%d %H:%M %Z')}, {os.cpu_count()} cores, load avg "
            f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())} at start; " + ", ".join(
                f"{n} {have.get(n, 'not installed')}" for n in ("torch", "transformers", "peft", "trl", "accelerate"))
            + f"; ours from {repo}")


def _gpu_name() -> str:
    import torch

    return f"{torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda})" if torch.cuda.is_available() else "no GPU visible"


def _best_anchor(cells: dict, impls: list[str], layout: str) -> tuple[str, float] | None:
    """(name, median useful tokens/s) of the fastest anchor row (ANCHORS) measured at `layout`."""
    rates = {i: statistics.median(r["tokens_per_s"] for r in cells[i, layout]) for i in impls
             if i in ANCHORS and cells[i, layout]}
    return max(rates.items(), key=lambda kv: kv[1]) if rates else None


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="steps before the timed window (>= 1)")
    parser.add_argument("--trl-steps", type=int, default=3, help="TRL's steps (1 warm-up)")
    parser.add_argument("--trl-repeat", type=int, default=1, help="rounds TRL runs in, the first ones (it is ~10x "
                        "slower here, ~2.5 min a run: one round keeps the default table near 15 min)")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds; cells are medians (min–max)")
    parser.add_argument("--layouts", default="1x1,2x1", help="PROCESSESxTHREADS, comma-separated")
    parser.add_argument("--impls", default=",".join(FINAL), help=f"rows, comma-separated, from {','.join(IMPLS)}; "
                        "'all' for every one (default: %(default)s, the goal's table)")
    parser.add_argument("--mode", default="full", choices=["full", "lora"])
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose remote_payload 'ours' runs")
    parser.add_argument("--assets", type=Path, default=Path(tempfile.gettempdir()) / "orch-bench-trainer-assets")
    parser.add_argument("--build", choices=sorted(MODELS), help="only build that model and its text data under --assets")
    parser.add_argument("--model", default="bench-gpt2", choices=sorted(MODELS), help="the random-init GPT-2 (%(default)s)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: bf16 autocast, one GPU per process")
    parser.add_argument("--hf-compile", action="store_true", help="torch_compile=True for Trainer and SFTTrainer")
    parser.add_argument("--epoch", action="store_true", help="data of exactly steps x processes x batch examples "
                        "per layout: every row's timed window holds the same examples (module docstring)")
    parser.add_argument("--worker", choices=WORKERS, help=argparse.SUPPRESS)
    parser.add_argument("--data", default="text", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.worker:
        return worker_bare(a) if a.worker == "bare" else worker_trl(a) if a.worker == "trl" else worker_hf(a)
    a.assets, a.repo = a.assets.resolve(), a.repo.resolve()
    build_assets(a.assets, a.build or "bench-gpt2")
    if a.build:
        return
    build_assets(a.assets, a.model)
    a.impls = ",".join(IMPLS) if a.impls == "all" else a.impls
    unknown = set(a.impls.split(",")) - set(IMPLS)
    if unknown:
        sys.exit(f"unknown --impls {sorted(unknown)}; choose from {','.join(IMPLS)}")
    if not 1 <= a.warmup < a.steps or a.trl_steps < 2:
        sys.exit("need 1 <= --warmup < --steps and --trl-steps >= 2")
    impls, layouts, notes = a.impls.split(","), a.layouts.split(","), []
    if "trl" in impls and importlib.util.find_spec("trl") is None:
        impls.remove("trl")
        notes.append("TRL: not installed (pip install -r bench/requirements.txt torch==2.13.0); left out.")
    procs = max(int(x.split("x")[0]) for x in layouts)
    # No implementation wraps around the data: a packed row holds ~4 examples (mean ~119 tokens).
    data, dist = alpaca_data.write_alpaca(a.assets, max(4096, a.steps * procs * BATCH * 6), SEED)
    per_layout = {lay: (alpaca_data.write_alpaca(a.assets, a.steps * int(lay.split("x")[0]) * BATCH, SEED)[0]
                        if a.epoch else data) for lay in layouts}
    n_layer, n_embd = MODELS[a.model][:2]
    where = "CPU" if a.device == "cpu" else _gpu_name()
    print(f"# Useful tokens/s, variable-length instruction data, {where}\n\n{header(a.repo)}.\nGPT-2 {n_layer}x{n_embd} "
          f"({a.model}) random init, {a.mode}, {'fp32' if a.device == 'cpu' else 'bf16'}, "
          f"{'torch_compile on the HF rows, ' if a.hf_compile else ''}batch {BATCH}/process, max_length {MAX_LEN}, {a.steps} steps ({a.warmup} warm-up; TRL "
          f"{a.trl_steps} (1), in {min(a.trl_repeat, a.repeat)} round(s)), median (min–max) of {a.repeat} interleaved rounds. Data {data.name}: {dist['n']} examples, "
          f"tokens/example min {dist['min']}, median {dist['median']:.0f}, mean {dist['mean']:.1f}, p90 {dist['p90']}, "
          f"max {dist['max']}"
          + (f"; --epoch: each layout trains once on steps x processes x {BATCH} examples of this distribution" if a.epoch else "")
          + ".\n", flush=True)
    cells: dict[tuple[str, str], list[dict]] = {(i, lay): [] for lay in layouts for i in impls}
    with tempfile.TemporaryDirectory(prefix="orch-bench-trainer-") as tmp:
        for rnd, order in enumerate(rotations(list(cells), a.repeat)):
            for impl, lay in order:
                if impl not in impls or (impl == "trl" and rnd >= a.trl_repeat):  # TRL failed earlier, or is done
                    continue
                steps, warmup = (a.trl_steps, 1) if impl == "trl" else (a.steps, a.warmup)
                try:
                    res = run_impl(impl, a.assets, per_layout[lay].name, a.mode, lay, steps, warmup, Path(tmp), a.repo,
                                   model=a.model, device=a.device, hf_compile=a.hf_compile)
                except RuntimeError as exc:
                    if impl != "trl":
                        sys.exit(str(exc))
                    impls.remove("trl")
                    notes.append(f"TRL: failed, left out: {str(exc)[-1500:]}")
                    continue
                if impl == "trl":  # the log is gone after the run's temporary folder
                    res["warnings"] = sorted({ln.strip()[:160] for ln in res["log"].read_text().splitlines() if "warn" in ln.lower()})
                cells[impl, lay].append(res)
                print(f"round {rnd + 1}/{a.repeat} {impl} {lay}: {res['tokens_per_s']:,.0f} tok/s, {res['wall_s']:.0f} s, "
                      f"load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    print("| implementation | layout | useful tok/s | ours / this | label tok/s | padding % | peak RSS MB |\n|---|---|---|---|---|---|---|")
    for lay in layouts:
        ours = statistics.median(r["tokens_per_s"] for r in cells[("ours", lay)]) if "ours" in impls else None
        for impl in impls:
            rs = cells[impl, lay]
            ratio = f"{ours / statistics.median(r['tokens_per_s'] for r in rs):.2f}" if ours else "n/a"
            print(f"| {impl} | {lay} | {spread([r['tokens_per_s'] for r in rs])} | {ratio} | {spread([r['labels_per_s'] for r in rs])}"
                  f" | {spread([100 * r['padding'] for r in rs], '{:.1f}')} | {spread([r['rss_mb'] for r in rs])} |")
    for lay in layouts:
        best = _best_anchor(cells, impls, lay)
        if best and "ours" in impls:
            ours = statistics.median(r["tokens_per_s"] for r in cells[("ours", lay)])
            print(f"\n{lay}: ours (the trainer's defaults) / the best anchor ({best[0]}) = {ours / best[1]:.2f} (goal: >= 1.3)")
    print(f"\nLoad avg {'/'.join(f'{x:.2f}' for x in os.getloadavg())} at end. Ratios are of medians. Peak RSS: max over "
          "all processes of a run (torchrun agent + ranks). ours and ours-pad pass no attention mask (right padding under "
          "causal attention), bare, hf and hf-group the collator's mask; hf-flat and trl no mask (position_ids restart "
          "per example); the HF rows use HF's DDP default (find_unused_parameters=True).")
    notes += [f"ours-pack {lay}: {rs[0]['note']}" for (impl, lay), rs in cells.items() if impl == "ours-pack" and rs]
    notes += [f"hf-flat: attn_implementation {rs[0]['info']['attn']}; a packed example vs alone: max |Δlogit| "
              f"{rs[0]['info']['isolation']:.1e} (~1e-6: isolated)" for (impl, _), rs in cells.items() if impl == "hf-flat" and rs][:1]
    for r in [rs[0] for (impl, _), rs in cells.items() if impl == "trl" and rs][:1]:
        i = r["info"]
        notes.append(f"TRL: attn_implementation {i['attn']}, packing_strategy {i['packing_strategy']}, padding_free "
                     f"{i['padding_free']}, completion_only_loss {i['completion_only_loss']}; a packed example vs alone: max "
                     f"|Δlogit| {i['isolation']:.1e} (~1e-6: isolated); warning lines in its log: {r['warnings'] or 'none'}")
    print("\n".join(notes))


if __name__ == "__main__":
    main()

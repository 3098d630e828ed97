"""The GPU check: what only a GPU can show about the built-in trainer, as one table, in under
8 minutes on one H100/H200-class card.

    python bench/gpu_check.py [--dry-run] [--work DIR] [--steps 20] [--no-install] [--no-write]

Rows: GPT-2 124M bf16 tokens/s and MFU (against the card's dense bf16 peak, as metrics.jsonl
reports it); gradient checkpointing's memory saving; fp16 with GradScaler (steps skipped on
overflow, the loss finite after them); alpaca-style rows padded vs packed (flash-attention varlen
when flash_attn is installed, the block-diagonal mask otherwise: the row says which); QLoRA 4-bit
on a 1.1B Llama-style model (peak memory, tokens/s, loaded through bitsandbytes, the adapter merged
on export) beside bf16 LoRA on the same model; peak GPU memory and speed of a full bf16 fine-tune of
the 1.1B model under DDP, DeepSpeed ZeRO-2 with the optimizer offloaded to CPU memory and ZeRO-3
with optimizer and parameters offloaded (`strategy: deepspeed`; at most 8 steps each, CPU Adam
being the slow part); `nproc_per_node: auto` as orch plans it from the
agent's GPU count; the GPU queue's inventory from the real nvidia-smi; `Trainer` (default, length
grouping, padding-free flattening) and TRL `SFTTrainer` on the same card through bench/trainer.py.

Models are built from configs with random weights (throughput and memory do not depend on the
weights): GPT-2 124M (12 x 768, vocab 50257) and a Llama-style 1.1B (TinyLlama's dimensions:
22 x 2048, 32 heads, 4 KV heads, MLP 5632, vocab 32000), with the benches' tiny BPE tokenizer;
data is generated (bench/alpaca_data.py). Nothing is downloaded but packages: missing ones are
installed with pip from the package registry (wheels only, torch held at its installed version);
flash-attn publishes no wheel there, so its row says "not installed" unless it already is. A row
whose run fails says why in one line. The table goes to stdout and, between the markers
`<!-- gpu-check -->` and `<!-- /gpu-check -->`, into bench/RESULTS.md (replacing the last one).

`--dry-run` prints every step (installs, models, runs with their configs, the file written) and
does none of them; it needs neither a GPU nor torch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "RESULTS.md"
START, END = "<!-- gpu-check -->", "<!-- /gpu-check -->"
# import name -> pip name; REQUIRED are installed when missing, OPTIONAL rows say "not installed" when pip cannot.
REQUIRED = {"torch": "torch", "transformers": "transformers", "peft": "peft", "safetensors": "safetensors",
            "tokenizers": "tokenizers", "accelerate": "accelerate", "numpy": "numpy", "pydantic": "pydantic",
            "yaml": "pyyaml"}
OPTIONAL = {"bitsandbytes": "bitsandbytes", "flash_attn": "flash-attn", "trl": "trl==1.16.0", "datasets": "datasets",
            "deepspeed": "deepspeed"}
# Published on the registry as a source archive only: pip makes a pure-Python wheel of it against the environment's
# own torch (no build isolation), compiling none of its ops (they compile at first use: CPU Adam with gcc and ninja).
SOURCE_ONLY = {"deepspeed"}
ZERO_STEPS = 8  # the DeepSpeed rows' steps at most: an offloaded AdamW step of 1.1B parameters runs on the CPU
LLAMA = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
         "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048}
GPT2_LORA = ["c_attn", "c_proj", "c_fc"]
LLAMA_LORA = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
COLUMNS = ("check", "setup", "tok/s", "MFU", "peak MiB", "result")


@dataclass(frozen=True)
class Run:
    """One torchrun of remote_payload.train: `name` is the run's folder under WORK."""

    name: str
    check: str
    setup: str
    config: dict


@dataclass
class Ctx:
    work: Path
    steps: int
    nproc: int
    python: str
    dry: bool
    rows: list[tuple[str, ...]] = field(default_factory=list)  # the trainer's, then the anchors'
    system: list[tuple[str, ...]] = field(default_factory=list)  # nproc auto and the queue
    runs: dict[str, dict] = field(default_factory=dict)  # run name -> its summary (or {"error": ...})

    def say(self, kind: str, text: str) -> None:
        print(f"[{kind}] {text}", flush=True)


def trainer_config(ctx: Ctx, model: str, data: str, precision: str, *, finetune: str = "full", batch: int = 8,
                   seq: int = 1024, ckpt: bool = False, quantize: str | None = None, merge: bool = False) -> dict:
    """A train.json for the built-in trainer: `data` text (1024-token lines), padded or packed (alpaca rows)."""
    lora = {"r": 16, "alpha": 32, "dropout": 0.0,
            "target_modules": LLAMA_LORA if model.startswith("llama") else GPT2_LORA} if finetune == "lora" else None
    return {"model": model, "finetune": finetune, "lora": lora,
            "data": {"train": f"{model}.jsonl" if data == "text" else "alpaca.jsonl",
                     "format": "text" if data == "text" else "alpaca", "max_length": seq, "packing": data == "packed"},
            "precision": precision, "batch_size": batch, "max_steps": ctx.steps, "lr": 1e-4, "warmup_steps": 2,
            "log_every": 1, "eval_every": 10**6, "save_every": 10**6,
            "memory": {"gradient_checkpointing": ckpt, "quantize": quantize}, "export": {"merge_lora": merge}}


def plan_runs(ctx: Ctx) -> list[Run]:
    """The trainer runs, in order; the checks read them by name."""
    g = "gpt2-124m"
    return [
        Run("bf16", "GPT-2 124M bf16", "text 8x1024, full", trainer_config(ctx, g, "text", "bf16")),
        Run("ckpt", "grad checkpointing", "as above +ckpt", trainer_config(ctx, g, "text", "bf16", ckpt=True)),
        Run("fp16", "fp16 + GradScaler", "text 8x1024, full", trainer_config(ctx, g, "text", "fp16")),
        Run("padded", "alpaca padded", "8 rows <=1024, full", trainer_config(ctx, g, "padded", "bf16")),
        Run("packed", "alpaca packed", "8 rows of 1024, full", trainer_config(ctx, g, "packed", "bf16")),
        Run("lora-1b", "Llama 1.1B LoRA", "bf16, packed 4x2048 +ckpt",
            trainer_config(ctx, "llama-1.1b", "packed", "bf16", finetune="lora", batch=4, seq=2048, ckpt=True)),
        Run("qlora-1b", "Llama 1.1B QLoRA", "4-bit, packed 4x2048 +ckpt",
            trainer_config(ctx, "llama-1.1b", "packed", "bf16", finetune="lora", batch=4, seq=2048, ckpt=True,
                           quantize="4bit", merge=True)),
        *zero_runs(ctx),
    ]


def zero_runs(ctx: Ctx) -> list[Run]:
    """DDP, ZeRO-2 + optimizer offload, ZeRO-3 + optimizer and parameter offload: the same full bf16
    fine-tune of the 1.1B model (`ZERO_STEPS` steps at most), compared by peak GPU memory."""
    full = trainer_config(ctx, "llama-1.1b", "packed", "bf16", batch=4, seq=1024, ckpt=True)
    full["max_steps"] = min(ctx.steps, ZERO_STEPS)
    setup = f"1.1B full bf16, 4x1024 +ckpt, {full['max_steps']} steps"
    return [Run("zero-ddp", "1.1B full, DDP", setup, full),
            Run("zero2-off", "DeepSpeed ZeRO-2", "as above, optimizer offload",
                {**full, "strategy": "deepspeed", "deepspeed": {"zero_stage": 2, "offload_optimizer": True}}),
            Run("zero3-off", "DeepSpeed ZeRO-3", "as above, optimizer + params offload",
                {**full, "strategy": "deepspeed",
                 "deepspeed": {"zero_stage": 3, "offload_optimizer": True, "offload_params": True}})]


# ---- setup: packages, models, data


def versions(python: str) -> dict[str, str | None]:
    """{module: its distribution's version, or None when `python` cannot find the module} for
    REQUIRED and OPTIONAL, asked of `python` in one process (no module is imported)."""
    probe = ("import importlib.metadata as m, importlib.util as u, json, sys\n"
             "def v(mod, dist):\n"
             "    if u.find_spec(mod) is None: return None\n"
             "    try: return m.version(dist)\n"
             "    except m.PackageNotFoundError: return 'installed'\n"
             "print(json.dumps({mod: v(mod, dist) for mod, dist in json.loads(sys.argv[1]).items()}))")
    names = {mod: dist.split("=")[0] for mod, dist in {**REQUIRED, **OPTIONAL}.items()}
    out = subprocess.run([python, "-c", probe, json.dumps(names)], capture_output=True, text=True)
    return json.loads(out.stdout) if out.returncode == 0 else dict.fromkeys(names)


def pip_argv(ctx: Ctx, packages: list[str]) -> list[str]:
    """pip from the registry only: wheels only (no builds), torch held by a constraint, bounded retries."""
    binary = ["--no-build-isolation"] if set(packages) <= SOURCE_ONLY else ["--only-binary=:all:"]
    return [ctx.python, "-m", "pip", "install", *binary, "--disable-pip-version-check", "--no-input",
            "--timeout", "30", "--retries", "1", "-c", str(ctx.work / "constraints.txt"), *packages]


def install(ctx: Ctx) -> dict[str, str]:
    """Missing packages installed one by one; returns {module: version or 'not installed (why)'}."""
    if not ctx.dry:
        ctx.work.mkdir(parents=True, exist_ok=True)
        torch_pin = subprocess.run([ctx.python, "-c", "import torch; print(torch.__version__.split('+')[0])"],
                                   capture_output=True, text=True).stdout.strip()
        (ctx.work / "constraints.txt").write_text(f"torch=={torch_pin}\n" if torch_pin else "")
    have = {} if ctx.dry else versions(ctx.python)
    why: dict[str, str] = {}
    for module, dist in {**REQUIRED, **OPTIONAL}.items():
        if ctx.dry:
            ctx.say("install", f"if `import {module}` fails: {shlex.join(pip_argv(ctx, [dist]))}")
        elif have.get(module) is None:
            ctx.say("install", shlex.join(pip_argv(ctx, [dist])))
            try:
                done = subprocess.run(pip_argv(ctx, [dist]), capture_output=True, text=True, timeout=300)
                if done.returncode:
                    why[module] = (done.stderr.strip().splitlines() or ["pip failed"])[-1][:100]
            except subprocess.TimeoutExpired:
                why[module] = "pip timed out after 300 s"
    if ctx.dry:
        return {}
    have = versions(ctx.python)
    return {m: v if v is not None else f"not installed ({why.get(m, 'pip found nothing')})" for m, v in have.items()}


BUILD = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import alpaca_data
work = Path(sys.argv[2])
alpaca_data.build_assets(work, "bench-gpt2")  # the tokenizer write_alpaca measures with
alpaca_data.build_assets(work, "gpt2-124m")
path, stats = alpaca_data.write_alpaca(work, 4096, 0)
(work / "alpaca.jsonl").write_text(path.read_text())
llama = work / "llama-1.1b"
if not (llama / "config.json").exists():
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(work / "gpt2-124m")
    config = LlamaConfig(**json.loads(sys.argv[3]), bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(llama)
    tok.save_pretrained(llama)
print(json.dumps(stats))
"""


def build(ctx: Ctx) -> None:
    """GPT-2 124M and the 1.1B Llama-style model from configs (random init), the tokenizer, the data."""
    ctx.say("build", f"GPT-2 124M (12 x 768, vocab 50257) and its 1024-token text lines -> {ctx.work}/gpt2-124m")
    ctx.say("build", f"Llama-style 1.1B {json.dumps(LLAMA)} bf16 -> {ctx.work}/llama-1.1b")
    ctx.say("build", f"4096 alpaca-style rows of 20-400 tokens -> {ctx.work}/alpaca.jsonl (all random init, no hub)")
    if not ctx.dry:
        out = subprocess.run([ctx.python, "-c", BUILD, str(BENCH), str(ctx.work), json.dumps(LLAMA)], env=run_env(),
                             capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"building the models failed:\n{out.stderr[-2000:]}")


def run_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


# ---- trainer runs


def torchrun_argv(ctx: Ctx, out: Path) -> list[str]:
    return [ctx.python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ctx.nproc),
            "-m", "remote_payload.train", "--config", str(out / "train.json"), "--out", str(out)]


def summarize(out: Path, steps: int) -> dict:
    """From metrics.jsonl: useful tok/s and MFU over the steps after the first 3 (start-up, compile),
    peak MiB, the loss scale's path, the packing mode logged, the merged export."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    timed = [r for r in rows if r["step"] > min(3, steps - 1)] or rows
    seconds = sum(r["interval_s"] for r in timed)
    mfu = [r["mfu"] for r in timed if r.get("mfu") is not None]
    log = (out / "log.txt").read_text()
    merged = out / "outputs" / "merged"
    return {"tok_s": sum(r["useful_tokens_per_s"] * r["interval_s"] for r in timed) / seconds,
            "mfu": sum(mfu) / len(mfu) if mfu else None, "peak": max(r["peak_mem_mb"] for r in rows),
            "scales": [r.get("scale") for r in rows], "losses": [r["loss"] for r in rows], "steps": rows[-1]["step"],
            "packing": next((ln.rsplit("; ", 1)[-1].rstrip(")") for ln in log.splitlines() if "INFO packing" in ln), None),
            "merged_mib": sum(f.stat().st_size for f in merged.glob("*.safetensors")) / 2**20 if merged.is_dir() else None}


def train(ctx: Ctx, run: Run) -> None:
    out = ctx.work / f"run-{run.name}"
    argv = torchrun_argv(ctx, out)
    ctx.say("run", f"{run.check} ({run.setup}): {shlex.join(argv)}")
    ctx.say("run", f"  train.json {json.dumps(run.config, separators=(',', ':'))}")
    if ctx.dry:
        return
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "train.json").write_text(json.dumps(run.config))
    with (out / "log.txt").open("w") as log:
        rc = subprocess.run(argv, cwd=ctx.work, env=run_env(), stdout=log, stderr=subprocess.STDOUT, timeout=420).returncode
    text = (out / "log.txt").read_text()
    if rc:
        why = next((ln.split(" ERROR ", 1)[1] for ln in text.splitlines() if " ERROR " in ln), f"exit {rc}, see {out}/log.txt")
        ctx.runs[run.name] = {"error": why[:110]}
        return
    ctx.runs[run.name] = summarize(out, ctx.steps)


def cells(s: dict) -> tuple[str, str, str]:
    if "error" in s:
        return "", "", ""
    mfu = f"{100 * s['mfu']:.1f}%" if s["mfu"] is not None else "n/a"
    return f"{s['tok_s']:,.0f}", mfu, f"{s['peak']:,.0f}"


def trainer_rows(ctx: Ctx, runs: list[Run], status: dict[str, str]) -> None:
    """One row per run, its `result` cell read against the related runs."""
    got = ctx.runs
    for run in runs:
        s = got.get(run.name, {"error": "did not run"})
        result = s.get("error", "")
        if not result and run.name == "bf16":
            result = "MFU vs the card's dense bf16 peak" if s["mfu"] is not None else "card not in the MFU table"
        elif not result and run.name == "ckpt" and "error" not in got.get("bf16", {"error": 1}):
            base = got["bf16"]
            result = f"memory -{100 * (1 - s['peak'] / base['peak']):.0f}%, speed x{s['tok_s'] / base['tok_s']:.2f}"
        elif not result and run.name == "fp16":
            scales = [x for x in s["scales"] if x is not None]
            finite = "finite" if all(math.isfinite(x) for x in s["losses"][-3:]) else "NOT finite"
            # GradScaler starts at 2**16 and halves on each skipped step (growth only after 2000 clean ones)
            skipped = round(math.log2(65536 / scales[-1])) if scales and 0 < scales[-1] <= 65536 else None
            result = (f"{skipped} of {s['steps']} steps skipped, scale {scales[-1]:g}, loss {finite}" if skipped is not None
                      else f"NO loss scale logged, loss {finite}")
        elif not result and run.name == "packed":
            mode = s["packing"] or "?"
            flash = status.get("flash_attn", "not installed")
            why = "" if mode == "varlen" else " (flash_attn not installed)" if flash.startswith("not") \
                else f" (flash_attn {flash} not used)"
            ratio = f", x{s['tok_s'] / got['padded']['tok_s']:.2f} padded" if "error" not in got.get("padded", {"error": 1}) else ""
            result = f"{mode}{why}{ratio}"
        elif not result and run.name == "padded":
            result = "per-batch padding"
        elif not result and run.name.startswith("zero") and run.name != "zero-ddp":
            base = got.get("zero-ddp", {"error": 1})
            result = (f"GPU memory -{100 * (1 - s['peak'] / base['peak']):.0f}% vs DDP, speed x{s['tok_s'] / base['tok_s']:.2f}"
                      if "error" not in base else "no DDP row to compare")
        elif not result and run.name == "zero-ddp":
            result = "AdamW state and grads on the GPU"
        elif not result and run.name == "lora-1b":
            result = "bf16 base"
        elif not result and run.name == "qlora-1b":
            base = got.get("lora-1b", {"error": 1})
            memory = f"memory -{100 * (1 - s['peak'] / base['peak']):.0f}% vs LoRA, " if "error" not in base else ""
            merged = f"merged {s['merged_mib']:,.0f} MiB" if s["merged_mib"] else "NO merged export"
            result = f"{memory}{merged}"
        ctx.rows.append((run.check, run.setup, *cells(s), result))


# ---- nproc auto, the queue, the anchors

NPROC_AUTO = """
import json, tempfile, torch
from orchestrator.plan.build import HostFacts, nproc_for
from orchestrator.spec.model import JobSpec
from remote_payload.gpuqueue.inventory import busy, inventory
from remote_payload.helper.agent import count_gpus
agent = count_gpus()
spec = JobSpec.model_validate({"name": "gpu-check", "hosts": ["here"], "launch": {"command": "python train.py"}})
nproc = nproc_for(spec, HostFacts(python="python3", root="/tmp", gpus=agent))
gpus = inventory(tempfile.mkdtemp() + "/gpus.json", {})["gpus"]
real = [torch.cuda.get_device_properties(i).total_memory >> 20 for i in range(torch.cuda.device_count())]
print(json.dumps({"agent": agent, "nproc": nproc, "torch": torch.cuda.device_count(), "gpus": gpus,
                  "busy": [busy(g) for g in gpus], "torch_mib": real}))
"""


def listed_gpus() -> int:
    """GPUs `nvidia-smi -L` lists (0 without nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in out.splitlines())


def nproc_auto(ctx: Ctx) -> int:
    """`nproc_per_node: auto` as orch plans it here (agent's nvidia-smi -L count) and the queue's
    inventory from the real nvidia-smi, both checked against torch; returns the process count."""
    ctx.say("check", "nproc_per_node auto: remote_payload.helper.agent.count_gpus() -> orchestrator.plan.build.nproc_for()")
    ctx.say("check", "GPU queue: remote_payload.gpuqueue.inventory.inventory() on the real nvidia-smi, vs torch.cuda")
    if ctx.dry:
        seen = listed_gpus()
        print(f"[check] nvidia-smi -L here: {seen} GPU(s)" + ("" if seen else ": a real run stops (no GPU)"))
        return max(seen, 1)
    out = subprocess.run([ctx.python, "-c", NPROC_AUTO], env=run_env(), capture_output=True, text=True, timeout=120)
    if out.returncode:
        why = (out.stderr.strip().splitlines() or ["failed"])[-1][:110]
        ctx.system += [("nproc_per_node auto", "", "", "", "", why), ("GPU queue", "", "", "", "", why)]
        return max(1, int(subprocess.run([ctx.python, "-c", "import torch; print(torch.cuda.device_count())"],
                                         capture_output=True, text=True).stdout.strip() or 1))
    r = json.loads(out.stdout)
    ok = "ok" if r["nproc"] == r["torch"] == r["agent"] else "MISMATCH"
    ctx.system.append(("nproc_per_node auto", f"{r['torch']} GPU(s) torch", "", "", "",
                     f"{ok}: agent {r['agent']} -> {r['nproc']} processes"))
    listed = [f"{g['index']}: {g['used_mib']}/{g['total_mib']} MiB{' busy' if b else ''}" for g, b in zip(r["gpus"], r["busy"])]
    same = [g["total_mib"] for g in r["gpus"]] == r["torch_mib"] or all(
        g["total_mib"] is not None and abs(g["total_mib"] - t) < 1024 for g, t in zip(r["gpus"], r["torch_mib"]))
    ok = "ok" if len(r["gpus"]) == r["torch"] and same else "MISMATCH"
    ctx.system.append(("GPU queue", "real nvidia-smi", "", "", "", f"{ok}: " + "; ".join(listed[:4])[:100]))
    return r["nproc"]


def anchors(ctx: Ctx, status: dict[str, str]) -> None:
    """Trainer (default, group_by_length, flattening) and SFTTrainer vs ours (the trainer's
    defaults, what a user gets without a flag) on this card."""
    has_trl = ctx.dry or not status.get("trl", "not").startswith("not")  # a dry run shows the full command
    impls = ["ours", "hf", "hf-group", "hf-flat"] + (["trl"] if has_trl else [])
    argv = [ctx.python, str(BENCH / "trainer.py"), "--device", "cuda", "--model", "gpt2-124m", "--assets", str(ctx.work),
            "--layouts", f"{ctx.nproc}x4", "--impls", ",".join(impls), "--repeat", "1", "--steps", str(ctx.steps),
            "--warmup", "5", "--trl-steps", str(ctx.steps)]
    ctx.say("run", f"anchors on this card: {shlex.join(argv)}")
    if ctx.dry:
        return
    out = subprocess.run(argv, env=run_env(), capture_output=True, text=True, timeout=600)
    table = [ln.strip("|").split("|") for ln in out.stdout.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    if out.returncode or not table:
        ctx.rows.append(("Trainer / TRL", "", "", "", "", (out.stderr.strip().splitlines() or ["failed"])[-1][:110]))
        return
    for cols in table:
        impl, tok_s, ratio = cols[0].strip(), cols[2].strip(), cols[3].strip()
        note = "" if impl == "ours" else f"ours / this = {ratio}"
        ctx.rows.append((f"bench {impl}", f"gpt2-124m bf16 x{ctx.nproc}", tok_s, "", "", note))
    if "trl" not in impls:
        ctx.rows.append(("bench trl", "", "", "", "", f"trl {status.get('trl', 'not installed')}"))


# ---- output


def table(rows: list[tuple[str, ...]]) -> str:
    return "\n".join(["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def header(ctx: Ctx, status: dict[str, str]) -> str:
    probe = "import torch; print(torch.cuda.get_device_name(0), '|', torch.__version__, '|', torch.version.cuda)"
    gpu = subprocess.run([ctx.python, "-c", probe], capture_output=True, text=True).stdout.strip()
    driver = subprocess.run("nvidia-smi --query-gpu=driver_version --format=csv,noheader", shell=True,
                            capture_output=True, text=True).stdout.strip().splitlines()[:1]
    versions = ", ".join(f"{m} {v}" for m, v in status.items() if m not in ("numpy", "pydantic", "yaml"))
    return (f"### GPU check, {time.strftime('%Y-%m-%d %H:%M %Z')}\n\n{gpu} x {ctx.nproc}, driver "
            f"{driver[0] if driver else '?'}; {versions}. {ctx.steps} steps a run, rates after the first 3. "
            "Models built from configs, random init (GPT-2 124M; Llama-style 1.1B); data generated; no hub.\n")


def write_results(text: str, path: Path) -> None:
    """`text` between the markers in `path`: the last check replaced, or appended."""
    old = path.read_text() if path.exists() else ""
    block = f"{START}\n{text}\n{END}"
    if START in old and END in old:
        new = old[: old.index(START)] + block + old[old.index(END) + len(END):]
    else:
        new = old.rstrip("\n") + "\n\n## GPU check (bench/gpu_check.py)\n\n" + block + "\n"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(new)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--dry-run", action="store_true", help="print every step; install, build and run nothing")
    parser.add_argument("--work", type=Path, help="models, data and runs (default: a new folder under /tmp)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps a run (>= 5; default %(default)s)")
    parser.add_argument("--no-install", action="store_true", help="never run pip: missing packages' rows say so")
    parser.add_argument("--no-write", action="store_true", help=f"print the table only, leave {RESULTS.name} alone")
    parser.add_argument("--results", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    a = parser.parse_args(argv)
    if a.steps < 5:
        parser.error("--steps must be at least 5")
    work = (a.work or Path(tempfile.gettempdir()) / "orch-gpu-check").resolve()
    ctx = Ctx(work=work, steps=a.steps, nproc=1, python=sys.executable, dry=a.dry_run)
    started = time.time()
    if ctx.dry:
        print(f"dry run: nothing is installed, built, run or written. Python {ctx.python}, work {work}")
    elif listed_gpus() == 0:  # before any install: a machine without a GPU gets nothing
        print("cannot run: nvidia-smi -L lists no GPU", file=sys.stderr)
        return 1
    status = install(ctx) if not a.no_install else {m: v or "not installed" for m, v in versions(ctx.python).items()}
    if not ctx.dry:
        missing = [m for m in REQUIRED if status[m].startswith("not")]
        cuda = subprocess.run([ctx.python, "-c", "import torch, sys; sys.exit(not torch.cuda.is_available())"]).returncode == 0
        if missing or not cuda:
            print(f"cannot run: {'missing ' + ', '.join(missing) if missing else 'no CUDA GPU visible to torch'}", file=sys.stderr)
            return 1
    ctx.nproc = nproc_auto(ctx)
    build(ctx)
    runs = plan_runs(ctx)
    for run in runs:
        if run.config.get("strategy") == "deepspeed" and status.get("deepspeed", "").startswith("not"):
            ctx.runs[run.name] = {"error": f"deepspeed {status['deepspeed']}"}
            continue
        train(ctx, run)
    if not ctx.dry:
        trainer_rows(ctx, runs, status)
    anchors(ctx, status)
    if ctx.dry:
        ctx.say("write", f"the table ({', '.join(COLUMNS)}) to stdout and to {a.results} between {START} and {END}")
        return 0
    text = header(ctx, status) + "\n" + table(ctx.rows + ctx.system) + f"\n\nWall time {time.time() - started:.0f} s.\n"
    print("\n" + text)
    if not a.no_write:
        write_results(text, a.results)
        print(f"written to {a.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

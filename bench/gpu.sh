#!/usr/bin/env bash
# GPU throughput and memory of the built-in trainer, one row per configuration, under torchrun:
#   GPT-2 124M-sized (12 x 768, vocab 50257, random init), batch 8 per GPU:
#     text rows of 1024 tokens: bf16/fp16 x LoRA/full;
#     alpaca-style rows of 20-400 tokens (bench/alpaca_data.py), max_length 1024:
#       padded vs packed (bf16 LoRA), packed full, QLoRA 4-bit packed;
#   a 1.3B GPT-2-shaped model, alpaca rows packed to 2048, batch 4, gradient checkpointing:
#     bf16 LoRA, QLoRA 4-bit.
# Columns: useful tokens/s (non-padding, all GPUs, after the first logged interval), MFU against
# the device's dense bf16 peak (metrics.jsonl), peak MiB (max over ranks), padding %.
# A row the trainer refuses (e.g. no bitsandbytes for QLoRA) prints its one-line reason.
#
#   bench/gpu.sh [WORK_DIR]          # env: PYTHON (python3), NPROC (all GPUs), STEPS (40)
#   NPROC=1 STEPS=6 SMOKE=1 bench/gpu.sh   # a smoke test of this script on a CPU (small model, fp32)
#
# Needs torch with CUDA, transformers, peft, tokenizers (bitsandbytes for the QLoRA rows,
# flash_attn for the varlen packing path); no network (models and data are generated).
# Budget: about 6-8 minutes on one H100/H200-class GPU (10 runs, mostly start-up).
# The one-table check of what only a GPU shows (checkpointing, GradScaler, QLoRA on a 1.1B
# Llama-style model, nproc auto, the queue, Trainer/TRL on the same card): bench/gpu_check.py.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
case $PY in */*) PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY") ;; esac  # absolute: the runs cd into WORK
WORK=${1:-$(mktemp -d /tmp/orch-bench-gpu.XXXX)}
STEPS=${STEPS:-40}
NPROC=${NPROC:-$(nvidia-smi -L 2>/dev/null | wc -l)}
SMOKE=${SMOKE:-}
[ "$NPROC" -gt 0 ] || { echo "no GPU found (nvidia-smi -L); set NPROC to run anyway" >&2; exit 1; }
export PYTHONPATH=$REPO HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$WORK"
SMALL=gpt2-124m BIG=gpt2-1b
if [ -n "$SMOKE" ]; then SMALL=bench-gpt2 BIG=bench-gpt2; fi

# Models (random init) and data: the tiny BPE tokenizer, text lines, alpaca-style rows.
"$PY" - "$REPO/bench" "$WORK" "$SMALL" "$BIG" <<'PY_ASSETS'
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import alpaca_data
work = Path(sys.argv[2])
for name in dict.fromkeys(["bench-gpt2", *sys.argv[3:]]):
    alpaca_data.build_assets(work, name)
path, stats = alpaca_data.write_alpaca(work, 4096, 0)
print(f"# alpaca rows (tokens): {stats}")
PY_ASSETS

"$PY" -c "import torch; gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'CPU'; print(f'# {gpu} x $NPROC, torch {torch.__version__}, CUDA {torch.version.cuda}, $(date -u +%F)')"
echo
echo "| model | data | precision | mode | memory | GPUs | useful tok/s | MFU | peak MiB | padding |"
echo "|---|---|---|---|---|---|---|---|---|---|"

# row MODEL DATA(text|padded|packed) PRECISION MODE(lora|full) QUANTIZE(-|4bit) CHECKPOINTING(0|1) BATCH SEQ
row() {
  local model=$1 data=$2 precision=$3 mode=$4 quant=$5 gc=$6 batch=$7 seq=$8
  if [ -n "$SMOKE" ]; then precision=fp32 seq=128; fi
  local out="$WORK/run-$model-$data-$precision-$mode-$quant-$gc"
  rm -rf "$out" && mkdir -p "$out"
  local lora='null' file="alpaca-4096.jsonl" format=alpaca packing=false ckpt=false quantize=null
  if [ "$mode" = lora ]; then lora='{"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": ["c_attn", "c_proj", "c_fc"]}'; fi
  if [ "$data" = text ]; then file="$model.jsonl" format=text; fi
  if [ "$data" = packed ]; then packing=true; fi
  if [ "$gc" = 1 ]; then ckpt=true; fi
  if [ "$quant" != - ]; then quantize="\"$quant\""; fi
  cat > "$out/train.json" <<JSON
{"model": "$model", "finetune": "$mode", "lora": $lora,
 "data": {"train": "$file", "format": "$format", "max_length": $seq, "packing": $packing},
 "precision": "$precision", "batch_size": $batch, "max_steps": $STEPS, "lr": 1e-4, "warmup_steps": 5,
 "log_every": 5, "eval_every": 1000000, "save_every": 1000000,
 "memory": {"gradient_checkpointing": $ckpt, "quantize": $quantize}}
JSON
  local memory="$quant"
  if [ "$gc" = 1 ]; then memory="$memory +ckpt"; fi
  local label="| $model | $data $seq | $precision | $mode | $memory | $NPROC"
  if ! (cd "$WORK" && "$PY" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" \
        -m remote_payload.train --config "$out/train.json" --out "$out" > "$out/log.txt" 2>&1); then
    local why
    why=$(grep -m1 ' ERROR ' "$out/log.txt" | sed 's/.* ERROR //' | cut -c1-160 || true)
    echo "$label | refused or failed: ${why:-see $out/log.txt} | | | |"
    return 0
  fi
  "$PY" - "$out/metrics.jsonl" "$label" <<'PY_ROW'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l][1:]
seconds = sum(r["interval_s"] for r in rows)
useful = sum(r["useful_tokens_per_s"] * r["interval_s"] for r in rows) / seconds
mfu = [r["mfu"] for r in rows if r.get("mfu") is not None]
mfu_s = f"{100 * sum(mfu) / len(mfu):.1f}%" if mfu else "n/a"
pad = sum(r["padding_fraction"] * r["interval_s"] for r in rows) / seconds
print(f"{sys.argv[2]} | {useful:,.0f} | {mfu_s} | {max(r['peak_mem_mb'] for r in rows):,.0f} | {100 * pad:.0f}% |")
PY_ROW
}

for precision in bf16 fp16; do
  for mode in lora full; do row "$SMALL" text "$precision" "$mode" - 0 8 1024; done
done
row "$SMALL" padded bf16 lora - 0 8 1024
row "$SMALL" packed bf16 lora - 0 8 1024
row "$SMALL" packed bf16 full - 0 8 1024
row "$SMALL" packed bf16 lora 4bit 0 8 1024
row "$BIG" packed bf16 lora - 1 4 2048
row "$BIG" packed bf16 lora 4bit 1 4 2048

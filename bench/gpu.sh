#!/usr/bin/env bash
# GPU throughput of the built-in trainer: a GPT-2 124M-sized model (12 layers x 768, vocab 50257,
# random init), seq 1024, batch 8 per GPU, bf16 and fp16 x LoRA and full, under torchrun.
# Prints a markdown table (tokens/s over all GPUs after the first logged interval, MFU against the
# device's dense bf16 peak as reported in metrics.jsonl, peak memory) to paste into bench/RESULTS.md.
#
#   bench/gpu.sh [WORK_DIR]          # env: PYTHON (python3), NPROC (all GPUs), STEPS (60)
#   NPROC=1 STEPS=12 MODEL=bench-gpt2 SEQ=128 bench/gpu.sh   # a smoke test of this script on a CPU
#
# Needs torch with CUDA, transformers, peft, tokenizers; no network (the model is generated).
# Budget: well under 8 minutes on one A100/H100-class GPU (4 runs of ~30-60 s, mostly start-up).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
WORK=${1:-$(mktemp -d /tmp/orch-bench-gpu.XXXX)}
STEPS=${STEPS:-60}
NPROC=${NPROC:-$(nvidia-smi -L 2>/dev/null | wc -l)}
MODEL=${MODEL:-gpt2-124m}
SEQ=${SEQ:-1024}
[ "$NPROC" -gt 0 ] || { echo "no GPU found (nvidia-smi -L); set NPROC to run anyway" >&2; exit 1; }
export PYTHONPATH=$REPO HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$WORK"

# The model and data: the tiny BPE tokenizer, a 124M GPT-2 config, text lines of >= 1024 tokens.
"$PY" "$REPO/bench/trainer.py" --build "$MODEL" --assets "$WORK"

"$PY" -c "import torch; gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'CPU'; print(f'# {gpu} x $NPROC, torch {torch.__version__}, CUDA {torch.version.cuda}, $MODEL, seq $SEQ, $(date -u +%F)')"
echo
echo "| precision | mode | GPUs | tokens/s | MFU | peak MiB |"
echo "|---|---|---|---|---|---|"
for precision in bf16 fp16; do
  for mode in lora full; do
    out="$WORK/run-$precision-$mode"
    rm -rf "$out" && mkdir -p "$out"
    lora='null'
    [ "$mode" = lora ] && lora='{"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": ["c_attn", "c_proj", "c_fc"]}'
    cat > "$out/train.json" <<EOF
{"model": "$MODEL", "finetune": "$mode", "lora": $lora,
 "data": {"train": "$MODEL.jsonl", "format": "text", "max_length": $SEQ},
 "precision": "$precision", "batch_size": 8, "max_steps": $STEPS, "lr": 1e-4, "warmup_steps": 5,
 "log_every": 10, "eval_every": 1000000, "save_every": 1000000}
EOF
    (cd "$WORK" && "$PY" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" \
        -m remote_payload.train --config "$out/train.json" --out "$out" > "$out/log.txt" 2>&1) \
      || { echo "| $precision | $mode | $NPROC | failed: see $out/log.txt | | |"; tail -5 "$out/log.txt" >&2; continue; }
    "$PY" - "$out/metrics.jsonl" "$precision" "$mode" "$NPROC" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l][1:]
tokens = sum(r["tokens_per_s"] * r["interval_s"] for r in rows)
seconds = sum(r["interval_s"] for r in rows)
mfu = [r["mfu"] for r in rows if r.get("mfu") is not None]
mfu_s = f"{100 * sum(mfu) / len(mfu):.1f}%" if mfu else "n/a"
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {tokens / seconds:,.0f} | {mfu_s} | {max(r['peak_mem_mb'] for r in rows):,.0f} |")
EOF
  done
done

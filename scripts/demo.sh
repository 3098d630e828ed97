#!/usr/bin/env bash
# The demo: set up, build the tiny GPT-2 and its data offline, then fine-tune it with LoRA
# on 2 processes on the built-in `local` host and fetch the result into runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export HF_HUB_OFFLINE=1
.venv/bin/python tools/make_tiny_assets.py examples/tiny/assets
.venv/bin/orch check jobs/tiny-lora-local.yaml
job=$(.venv/bin/orch submit jobs/tiny-lora-local.yaml --follow --json | .venv/bin/python -c "import json,sys; print(json.load(sys.stdin)['job_id'])")
.venv/bin/orch fetch "$job"
echo "done: runs/$job/outputs holds the LoRA adapter; orch status shows the job"

#!/usr/bin/env bash
# Create .venv (if missing) and install orch with its trainer and test extras.
# torch is pinned to 2.13.0 (a CPU wheel on the project's machines) and installed first,
# so nothing later can pull an unpinned multi-GB CUDA build. Re-running is cheap: the
# install is skipped while pyproject.toml is unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.orch-installed
want=$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
    .venv/bin/python -m pip install -q "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
    .venv/bin/python -m pip install -q -e ".[train,test]" "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
    .venv/bin/python -c "import torch, transformers, peft, orchestrator" 
    echo "$want" > "$stamp"
fi

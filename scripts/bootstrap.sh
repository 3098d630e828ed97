#!/usr/bin/env bash
# Create .venv (if missing) and install orch with its trainer and test extras.
# torch is pinned to 2.13.0 (a CPU wheel on the project's machines) and installed first,
# so nothing later can pull an unpinned multi-GB CUDA build. Re-running is cheap: the
# install is skipped while pyproject.toml is unchanged. Each step says what it installs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
step() { printf 'bootstrap: %s\n' "$*" >&2; }
# pip's own lines that say what it is doing, one per package; the rest (warnings about
# editable installs, progress bars) is noise here. pip's exit status is kept (pipefail).
pipe_pip() {
    .venv/bin/python -m pip "$@" 2>&1 \
        | { grep --line-buffered -E '^(Collecting|Installing collected|Successfully installed|ERROR|error:)' || true; } \
        | sed -u 's/^/  /' >&2
}
if [ ! -x .venv/bin/python ]; then
    step "creating .venv with $("$PY" --version 2>&1)"
    "$PY" -m venv .venv
fi
stamp=.venv/.orch-installed
want=$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    start=$SECONDS
    step "upgrading pip"
    pipe_pip install --upgrade pip
    step "installing torch 2.13.0 (CPU build; about a minute)"
    pipe_pip install "torch==2.13.0"
    step "installing orch with its trainer and test extras (transformers, peft, pytest, ...)"
    # compat: the checkout on sys.path through a plain .pth line. The default editable finder
    # imports pathlib, re and fnmatch in every Python this venv starts (~35 ms each: the CLI,
    # and the helpers, supervisors and workers the tests run with this interpreter).
    pipe_pip install -e ".[train,test]" --config-settings editable_mode=compat "torch==2.13.0"
    .venv/bin/python -c "import torch, transformers, peft, orchestrator"
    echo "$want" > "$stamp"
    step "ready in $((SECONDS - start)) s: .venv/bin/orch"
else
    step ".venv is up to date (delete .venv/.orch-installed to reinstall)"
fi

#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run ctxext's main job on a built-in model, offline, on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export TOKENIZERS_PARALLELISM=false
if ctxext demo --help >/dev/null 2>&1; then
  exec ctxext demo "$@"
fi
# Until `ctxext demo` exists: inspect the built-in tiny model, extend it 4× with YaRN, inspect again.
ctxext inspect builtin:tiny-llama
ctxext extend builtin:tiny-llama --method yarn --target-length 1024 --out runs/demo/tiny-llama-yarn-1k --overwrite
ctxext inspect runs/demo/tiny-llama-yarn-1k

#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run ctxext's main job, `ctxext demo`, offline on the CPU:
# the grown model evaluated unpatched at 4x its window, extended with YaRN and llama3, the llama3
# model fine-tuned with nf4 QLoRA on the retrieval mixture, and all of them compared. Extra arguments go to `ctxext demo` (e.g. --fresh, --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export TOKENIZERS_PARALLELISM=false
exec ctxext demo "$@"

#!/usr/bin/env bash
# Measured peak GPU memory of every GPU-only training path against `ctxext plan` (one line each, then a summary),
# then the sequence split's GPU tests (ring, hybrid; one line, skipped on fewer than 2 GPUs) and the full fine-tune
# under the shipped FSDP2 and DeepSpeed ZeRO-3 configs (one line).
# Nothing is downloaded: a random Llama-3-8B-shaped model is built from the bundled config. Sized for under 8 minutes on one
# H200 with the defaults (not yet timed: no GPU so far). Without CUDA: one line, exit code 2. Output format: docs/planning.md ("GPU check").
#
#   scripts/gpu-check.sh                                  # 4 layers, 32,768 tokens
#   GPU_CHECK_LAYERS=2 GPU_CHECK_SEQ_LEN=65536 scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec python scripts/gpu_check.py "$@"

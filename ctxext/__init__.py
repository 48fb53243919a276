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
    "METHODS": "ctxext.rope.methods",
    "RopeCheck": "ctxext.rope.runtime",
    "RopeConfigError": "ctxext.rope.types",
    "RopeError": "ctxext.rope.types",
    "RopeMismatchError": "ctxext.rope.types",
    "RopePlan": "ctxext.rope.types",
    "RopeState": "ctxext.rope.types",
    "apply_plan": "ctxext.rope.plan",
    "check_model_rope": "ctxext.rope.runtime",
    "patch_model": "ctxext.rope.runtime",
    "plan_extension": "ctxext.rope.plan",
    "read_rope": "ctxext.rope.read",
    "rebuild_rotary": "ctxext.rope.runtime",
    "reference_rope": "ctxext.rope.scaling_types",
    "register_method": "ctxext.rope.methods",
    "RopeMethod": "ctxext.rope.methods",
    "reset_dynamic_rope": "ctxext.rope.runtime",
    "verify_model_rope": "ctxext.rope.runtime",
    "extend_folder": "ctxext.models.folder",
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
    "RunRecord": "ctxext.artifacts.run_record",
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

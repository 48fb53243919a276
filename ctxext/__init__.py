"""ctxext: extend the context window of Hugging Face causal LMs.

The public API for notebooks::

    from ctxext import plan_extension, patch_model, verify_model_rope, read_rope
"""

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
]

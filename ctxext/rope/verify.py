"""Verify what the user will load: a written model folder, reloaded from disk, against the plan it implements."""

from __future__ import annotations

from pathlib import Path

from ctxext.errors import InputError
from ctxext.models.weights import check_weights_readable
from ctxext.rope.runtime import runtime_model_from_config, verify_against_plan
from ctxext.rope.types import RopeMismatchError, RopePlan


def verify_folder(folder: str | Path, plan: RopePlan) -> str:
    """Reload a written model folder's config with plain transformers and check its RoPE and weights.

    The config is read back from ``config.json`` (so a key lost in writing, e.g. a dropped
    ``partial_rotary_factor``, shows up), the rotary modules are built from it exactly as
    ``from_pretrained`` builds them, and their ``inv_freq`` and cos/sin at positions 0, L − 1 and
    T − 1 are compared with the reference built from ``plan``. Every weight file must be complete.

    Args:
        folder: the written folder (before it is moved into place).
        plan: what the folder must implement.

    Returns:
        A one-line summary for the user.

    Raises:
        RopeMismatchError: the folder's RoPE is not the plan's.
        InputError: the config cannot be read back, or a weight file is damaged.
    """
    from transformers import AutoConfig

    folder = Path(folder)
    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise InputError(f"the written config.json cannot be read back by transformers: {exc}") from None
    summary = verify_against_plan(runtime_model_from_config(config), plan)
    files = check_weights_readable(folder)
    return f"{summary}; {len(files)} weight file(s) readable"


__all__ = ["RopeMismatchError", "verify_folder"]

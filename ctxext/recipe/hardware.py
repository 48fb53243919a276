"""What the recipe's machine-dependent settings mean on a given machine (``auto`` resolved), without torch.

The loader (:mod:`ctxext.models.build`) and the refusals (:mod:`ctxext.recipe.refusals`) both resolve them here, so
``ctxext validate`` and ``ctxext train`` read a setting the same way; this module imports nothing of ctxext's, so
both can.
"""

from __future__ import annotations

__all__ = ["attention_problem", "compute_dtype_name", "resolve_attention"]


def compute_dtype_name(setting: str, cuda: bool) -> str:
    """The compute dtype of a run (``quantization.compute_dtype``): ``auto`` is bf16 on CUDA, fp32 on the CPU."""
    if setting != "auto":
        return setting
    return "bfloat16" if cuda else "float32"


def attention_problem(setting: str, cuda: bool, has_flash: bool) -> str | None:
    """Why ``model.attn_implementation`` cannot run here, or ``None``."""
    if setting == "flash_attention_2" and not (cuda and has_flash):
        return "flash_attention_2 needs CUDA and the flash-attn package; use auto or sdpa here"
    return None


def resolve_attention(setting: str, cuda: bool, has_flash: bool) -> str:
    """What ``model.attn_implementation`` means here: ``auto`` is flash attention 2 where installed on CUDA, else SDPA.

    A setting :func:`attention_problem` refuses is returned as given.
    """
    if setting == "auto":
        return "flash_attention_2" if cuda and has_flash else "sdpa"
    return setting

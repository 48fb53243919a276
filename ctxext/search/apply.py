"""Switching one loaded model between RoPE settings in place (candidate factors, named methods, the base).

Loading a model per candidate would dominate a search; instead the model is loaded once and, for each
candidate, its config's RoPE fields are reset to the original ones and the new setting is applied with
:func:`ctxext.rope.runtime.patch_model` — which rebuilds the rotary modules and verifies their runtime
frequencies against ctxext's reference, so every scored candidate runs with exactly the factors logged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ctxext.rope.read import read_rope
from ctxext.rope.runtime import RopeSnapshot, patch_model
from ctxext.rope.types import RopePlan

# The searched model keeps the original behaviour inside the original window: short factors of 1 and
# no attention scaling (transformers applies ``attention_factor`` at every length, short ones included).
SEARCH_ATTENTION_FACTOR = 1.0


def resolve_attention_factor(value: str | float, scale: float, original_length: int) -> float:
    """The attention factor a search uses: ``1`` (default), ``auto`` or a number.

    ``auto`` is LongRoPE / Phi-3's ``√(1 + ln s / ln L)``, what transformers computes when the key is
    absent. transformers multiplies cos/sin by it at every length, so anything but 1 also changes the
    model inside its original window (slightly; the report measures by how much).

    Raises:
        InputError: not ``auto`` and not a positive number.
    """
    import math

    from ctxext.errors import InputError

    if isinstance(value, str) and value.strip().lower() == "auto":
        return 1.0 if scale <= 1 else math.sqrt(1 + math.log(scale) / math.log(original_length))
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number <= 0:
        raise InputError(f"attention factor {value!r} must be 'auto', 'search' or a positive number (1 = no scaling)")
    return number


def longrope_options(long_factor: np.ndarray | list[float], attention_factor: float = SEARCH_ATTENTION_FACTOR) -> dict:
    """The ``longrope`` method options of a searched result: short factors 1, the long factors, the attention factor."""
    long_ = [float(v) for v in long_factor]
    return {"short_factor": [1.0] * len(long_), "long_factor": long_, "attention_factor": float(attention_factor)}


class RopeSwitch:
    """Apply RoPE settings to one loaded model, always relative to its original config.

    Args:
        model: a loaded causal LM (its config is the original one when this is created).
        original_length: overrides the pretraining length.
    """

    def __init__(self, model: torch.nn.Module, original_length: int | None = None):
        self.model = model
        self.original_length = original_length
        self._original = RopeSnapshot(model)
        self.state = read_rope(model.config, original_length=original_length)

    def restore(self) -> None:
        """Put the original RoPE back (config fields and rotary modules)."""
        self._original.apply(self.model)

    def use(self, method: str, target_length: int, options: dict[str, Any] | None = None) -> RopePlan:
        """Extend the model with a named method (or ``longrope`` factors), from its original config.

        Args:
            method: a ctxext method name.
            target_length: the target context.
            options: method options.

        Returns:
            The applied plan (the runtime RoPE is verified).
        """
        self.restore()
        return patch_model(self.model, method, target_length, options, self.original_length)

    def use_factors(
        self, long_factor: np.ndarray, target_length: int, attention_factor: float = SEARCH_ATTENTION_FACTOR
    ) -> RopePlan:
        """Run the model with searched long factors (short factors 1) at ``target_length``."""
        return self.use("longrope", target_length, longrope_options(long_factor, attention_factor))

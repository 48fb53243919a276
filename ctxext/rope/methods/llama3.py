"""Llama 3.1 scaling: low frequencies divided by s, high frequencies kept, a smooth mix in between."""

from __future__ import annotations

from typing import Any

from ctxext.rope.methods.base import Option, RopeMethod, positive
from ctxext.rope.methods.registry import register_method
from ctxext.rope.types import RopePlan, RopeState


@register_method
class Llama3(RopeMethod):
    """Rope type ``llama3`` with ``factor = s`` and the two wavelength thresholds."""

    name = "llama3"
    summary = "Llama 3.1 style: low frequencies ÷ s, high kept, smooth in between"
    order = 50
    options = (
        Option("low_freq_factor", float, "low frequency factor", 1.0, check=positive),
        Option("high_freq_factor", float, "high frequency factor", 4.0, check=positive),
    )

    def plan(self, state: RopeState, target: int, s: float, opts: dict[str, Any]) -> RopePlan:
        """``{"rope_type": "llama3", "factor": s, …}``; ``max_position_embeddings`` becomes the target."""
        params = {
            "rope_type": "llama3",
            "factor": s,
            "low_freq_factor": float(opts["low_freq_factor"]),
            "high_freq_factor": float(opts["high_freq_factor"]),
            "original_max_position_embeddings": state.original_length,
            **self.base_parameters(state),
        }
        return self.make_plan(state, target, s, params, target)

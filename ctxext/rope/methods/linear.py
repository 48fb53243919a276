"""Linear position interpolation (Chen et al. 2023): every frequency divided by the scale s."""

from __future__ import annotations

from typing import Any

from ctxext.rope.methods.base import RopeMethod
from ctxext.rope.methods.registry import register_method
from ctxext.rope.types import RopePlan, RopeState


@register_method
class Linear(RopeMethod):
    """Positions divided by s: rope type ``linear`` with ``factor = s``."""

    name = "linear"
    summary = "position interpolation (Chen et al. 2023): every frequency divided by s"
    order = 10

    def plan(self, state: RopeState, target: int, s: float, opts: dict[str, Any]) -> RopePlan:
        """``{"rope_type": "linear", "factor": s}``; ``max_position_embeddings`` becomes the target."""
        params = {"rope_type": "linear", "factor": s, **self.base_parameters(state)}
        return self.make_plan(state, target, s, params, target)

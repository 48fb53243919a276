"""YaRN (Peng et al. 2023): NTK-by-parts interpolation plus an attention temperature."""

from __future__ import annotations

from typing import Any

from ctxext.rope.methods.base import Option, RopeMethod, positive
from ctxext.rope.methods.registry import register_method
from ctxext.rope.types import RopePlan, RopeState


@register_method
class Yarn(RopeMethod):
    """Rope type ``yarn``: dimensions rotating more than β times in the original context kept, fewer than α divided."""

    name = "yarn"
    summary = "YaRN (Peng et al. 2023): NTK-by-parts interpolation + attention temperature"
    order = 40
    options = (
        Option("beta_fast", float, "β, rotations above which a dim is kept", 32.0, check=positive),
        Option("beta_slow", float, "α, rotations below which a dim is interpolated", 1.0, check=positive),
        Option(
            "attention_factor", float, "override the attention scaling (default: the method's formula)", check=positive
        ),
        Option(
            "truncate",
            bool,
            "round the ramp's ends to whole dimensions (transformers' default: true; false for gpt-oss-style YaRN)",
        ),
    )

    def plan(self, state: RopeState, target: int, s: float, opts: dict[str, Any]) -> RopePlan:
        """``factor = s``, the original length, β and α; ``attention_factor`` and ``truncate`` only when given."""
        params = {
            "rope_type": "yarn",
            "factor": s,
            "original_max_position_embeddings": state.original_length,
            "beta_fast": float(opts["beta_fast"]),
            "beta_slow": float(opts["beta_slow"]),
            **self.base_parameters(state),
        }
        if opts.get("attention_factor") is not None:
            params["attention_factor"] = float(opts["attention_factor"])
        if opts.get("truncate") is not None:
            params["truncate"] = bool(opts["truncate"])
        return self.make_plan(state, target, s, params, target)

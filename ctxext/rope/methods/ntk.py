"""Static NTK-aware scaling: a larger base, ``b·α^(d/(d−2))``, written as unscaled RoPE with a new theta."""

from __future__ import annotations

import math
from typing import Any

from ctxext.rope.methods.base import Option, RopeMethod
from ctxext.rope.methods.registry import register_method
from ctxext.rope.types import RopeConfigError, RopePlan, RopeState


@register_method
class Ntk(RopeMethod):
    """NTK-aware scaling as a change of base, so every consumer (vLLM, llama.cpp, older transformers) reads it."""

    name = "ntk"
    summary = "static NTK-aware: rope_theta raised to b·s^(d/(d−2))"
    order = 20
    options = (Option("alpha", float, "the NTK alpha (default target/original)"),)

    def plan(self, state: RopeState, target: int, s: float, opts: dict[str, Any]) -> RopePlan:
        """``rope_theta = b·α^(d/(d−2))`` with rope type ``default``; α defaults to s."""
        alpha = float(opts["alpha"]) if opts.get("alpha") is not None else s
        if not math.isfinite(alpha) or alpha <= 1:
            raise RopeConfigError(
                {
                    "alpha": f"must be a number > 1 (it multiplies the wavelengths; ≤ 1 keeps or shortens them), got "
                    f"{alpha:g}; leave it out to use target/original = {s:g}"
                }
            )
        d = state.rotary_dim
        params = {"rope_type": "default", **self.base_parameters(state)}
        params["rope_theta"] = state.rope_theta * alpha ** (d / (d - 2))
        return self.make_plan(state, target, s, params, target)

    def intent_problems(self, plan: RopePlan) -> list[str]:
        """A raised base is the whole method."""
        return raised_theta_problems(plan)


def raised_theta_problems(plan: RopePlan) -> list[str]:
    """``rope_theta`` must be above the base's (methods that extend by raising the base)."""
    if not float(plan.rope_parameters["rope_theta"]) > float(plan.base_parameters.get("rope_theta", 0)):
        return ["rope_theta is not above the base rope_theta"]
    return []

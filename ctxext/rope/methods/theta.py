"""ABF / Code Llama: a new RoPE base given directly."""

from __future__ import annotations

from typing import Any

from ctxext.rope.methods.base import Option, RopeMethod
from ctxext.rope.methods.ntk import raised_theta_problems
from ctxext.rope.methods.registry import register_method
from ctxext.rope.types import RopeConfigError, RopePlan, RopeState


@register_method
class Theta(RopeMethod):
    """Rope type ``default`` with the given ``rope_theta``."""

    name = "theta"
    summary = "ABF / Code Llama: set rope_theta directly (needs --rope-theta)"
    order = 60
    options = (Option("rope_theta", float, "the new base (e.g. 1e6); required"),)

    def plan(self, state: RopeState, target: int, s: float, opts: dict[str, Any]) -> RopePlan:
        """The new base, which must be above the model's."""
        theta = opts.get("rope_theta")
        if theta is None:
            raise RopeConfigError({"rope_theta": "method 'theta' needs the new base, e.g. --rope-theta 1000000"})
        theta = float(theta)
        if theta <= state.rope_theta:
            raise RopeConfigError(
                {
                    "rope_theta": f"must be larger than the model's current rope_theta ({state.rope_theta:g}) to "
                    f"lengthen wavelengths, got {theta:g}"
                }
            )
        params = {"rope_type": "default", **self.base_parameters(state)}
        params["rope_theta"] = theta
        return self.make_plan(state, target, s, params, target)

    def intent_problems(self, plan: RopePlan) -> list[str]:
        """A raised base is the whole method."""
        return raised_theta_problems(plan)

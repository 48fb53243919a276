"""A RoPE method in one file, as docs/extending.md shows: power-law ABF, ``rope_theta × s^k``.

Registered when imported; tests/integration/test_extension_points.py checks that it reaches the recipe schema and the
``ctxext extend`` flags, and extends and verifies a tiny model.
"""

from __future__ import annotations

from typing import Any

from ctxext.rope.methods import Option, RopeMethod, positive, register_method
from ctxext.rope.types import RopePlan, RopeState


@register_method
class PowerTheta(RopeMethod):
    """The base raised by the scale to a power: ``rope_theta = b · s^k`` (ABF with a base that follows the target)."""

    name = "toy_power_theta"
    summary = "toy: rope_theta multiplied by s^k"
    options = (Option("theta_power", float, "the power k of the scale s", 2.0, check=positive),)

    def plan(self, state: RopeState, target: int, s: float, opts: dict[str, Any]) -> RopePlan:
        """Unscaled RoPE (rope type ``default``) with the larger base."""
        params = {"rope_type": "default", **self.base_parameters(state)}
        params["rope_theta"] = state.rope_theta * s ** float(opts["theta_power"])
        return self.make_plan(state, target, s, params, target)

    def intent_problems(self, plan: RopePlan) -> list[str]:
        """The base must have grown by exactly ``s^k``."""
        grown = plan.rope_parameters["rope_theta"] / plan.base_parameters["rope_theta"]
        return [] if grown > 1 else ["rope_theta is not above the base rope_theta"]

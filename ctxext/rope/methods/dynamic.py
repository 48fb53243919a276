"""Dynamic NTK (YaRN paper §3.3): the NTK base recomputed from the length of the sequence being processed."""

from __future__ import annotations

from typing import Any

from ctxext.rope.methods.base import Option, RopeMethod
from ctxext.rope.methods.registry import register_method
from ctxext.rope.types import RopePlan, RopeState


@register_method
class Dynamic(RopeMethod):
    """Rope type ``dynamic``; ``max_position_embeddings`` stays at the pretraining length."""

    name = "dynamic"
    summary = (
        "dynamic NTK (YaRN paper §3.3): NTK base with α = T/L for a sequence of T > L tokens (transformers factor 1); "
        "--factor f uses transformers' α = f·T/L − (f−1) instead"
    )
    order = 30
    options = (Option("factor", float, "transformers' factor f in α = f·T/L − (f−1); 1 gives α = T/L", 1.0),)

    def plan(self, state: RopeState, target: int, s: float, opts: dict[str, Any]) -> RopePlan:
        """``{"rope_type": "dynamic", "factor": f}`` with ``max_position_embeddings`` = the original length."""
        # One definition: the YaRN paper's Dynamic NTK, α = max(1, T/L), is transformers'
        # base·((f·T/L) − (f−1))^(d/(d−2)) with f = 1 (transformers accepts factor ≥ 1). Writing f = s, as
        # is common, gives α = s² − s + 1 at the target (13 at 4×), far more than the NTK scale s.
        factor = float(opts["factor"])
        plan = self.make_plan(
            state,
            target,
            s,
            {"rope_type": "dynamic", "factor": factor, **self.base_parameters(state)},
            state.original_length,
        )
        # transformers starts dynamic scaling at config.max_position_embeddings (the rotary module's
        # original_max_seq_len), so it must stay at the pretraining length: a config that says the
        # target length there would run unscaled, i.e. extrapolate, all the way up to the target.
        plan.notes.append(
            f"max_position_embeddings stays {state.original_length}: transformers' dynamic NTK scales only beyond it; "
            f"the target length {target} is recorded under config.ctxext"
        )
        return plan

"""Recipe rules for splitting one sequence over processes (``train.sequence_parallel_size`` and the ring's size).

The split (Ulysses, with torch's ring around it: :mod:`ctxext.training.sequence_parallel`) attends causally over the
whole gathered row (each packed document on its own, found from the positions that restart at 0) and rotates each
shard at its global positions. That is exact for static RoPE methods, PoSE rows and rows of several documents; it is
not for the settings refused here.
"""

from __future__ import annotations

from typing import Any

# RoPE methods whose frequencies depend on the length of the sequence processed (rope.LENGTH_DEPENDENT_TYPES holds
# the transformers rope types; these are the ctxext method names that produce them).
LENGTH_DEPENDENT_METHODS = frozenset({"dynamic", "longrope"})


def sequence_parallel_refusal(recipe: Any) -> str | None:
    """Why a recipe cannot split its sequences over several processes (either key), or ``None``.

    Args:
        recipe: a :class:`ctxext.recipe.schema.Recipe` whose sections are already validated.

    Returns:
        A message that names the key at fault and the way out, or ``None``.
    """
    size, ring = recipe.train.sequence_parallel_size, recipe.train.context_parallel_size
    if size == 1 and ring == 1:
        return None
    # The two compose (the ring around the head split): the rules below hold for either.
    key = f"train.sequence_parallel_size: {size}" if size > 1 else f"train.context_parallel_size: {ring}"
    if recipe.rope.method in LENGTH_DEPENDENT_METHODS:
        return (
            f"{key} with rope.method {recipe.rope.method!r}: its frequencies depend on the length of the sequence "
            "processed, and each process sees only its shard; use a static method (yarn, linear, ntk, llama3, "
            "theta) or set it to 1"
        )
    if recipe.model.attn_implementation == "eager":
        return (
            f"{key} needs sdpa or flash attention (eager builds a full mask the split cannot use); "
            "set model.attn_implementation: sdpa"
        )
    return None

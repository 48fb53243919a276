"""Per-dimension RoPE rescale factors: the named methods as factors, the seed grid, the monotone constraint.

A *long factor* vector ``λ`` (``d/2`` values, LongRoPE's ``long_factor``) divides the model's own
frequencies: ``inv_freq_i = b^(−2i/d) / λ_i``. Every named method is such a vector —
``λ_i = inv_freq_orig_i / inv_freq_method_i`` with the method's frequencies taken from ctxext's
independent reference (:func:`ctxext.rope.scaling_types.reference_rope`), so a seed reproduces its method's
frequencies exactly (PI: ``λ_i = s``; NTK: ``λ_i = α^(2i/(d−2))``; YaRN / llama3: a ramp from 1 to
``s``). Attention scaling is not part of a factor vector: see ``docs/search-method.md``.

Index ``i = 0`` is the highest frequency. LongRoPE's constraint, kept by every operator of the search,
is that factors never decrease from high to low frequency (``λ_i ≤ λ_{i+1}``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ctxext.rope.plan import plan_extension
from ctxext.rope.read import read_rope
from ctxext.rope.scaling_types import reference_rope
from ctxext.rope.types import RopeError, RopeState

# Tolerance of the monotone check: seeds are computed in float64 and may carry rounding noise.
MONOTONE_TOL = 1e-12

# The method-parameter grid the search is seeded with (besides each method's defaults). Chosen to span
# the published settings (YaRN β = 32/1, Llama 3.1 low/high = 1/4) and the small-window regime, where
# the defaults interpolate every dimension (a 64-token window: the fastest dimension rotates only ~10
# times, so β_fast = 32 keeps none).
YARN_BETA_FAST = (4.0, 8.0, 16.0, 32.0, 64.0)
YARN_BETA_SLOW = (0.5, 1.0, 2.0)
LLAMA3_LOW_HIGH = ((1.0, 2.0), (1.0, 4.0), (1.0, 8.0), (2.0, 4.0), (2.0, 8.0))
NTK_ALPHA_TIMES_S = (0.5, 1.0, 2.0, 4.0)


@dataclass(frozen=True)
class Seed:
    """A named method's frequencies written as long factors.

    Attributes:
        name: a readable label, e.g. ``yarn(beta_fast=8,beta_slow=1)``.
        method: the ctxext method name.
        options: the method options used.
        factors: ``d/2`` long factors (float64).
    """

    name: str
    method: str
    options: dict[str, Any]
    factors: np.ndarray


def is_monotone(factors: np.ndarray, tol: float = MONOTONE_TOL) -> bool:
    """Whether factors never decrease from high to low frequency (LongRoPE's constraint)."""
    f = np.asarray(factors, dtype=np.float64)
    return bool(np.all(np.diff(f) >= -tol))


def base_inv_freq(state: RopeState) -> np.ndarray:
    """The model's own (unscaled) inverse frequencies ``b^(−2i/d)``, float64."""
    params = {"rope_type": "default", "rope_theta": state.rope_theta}
    inv, _ = reference_rope(params, state.rotary_dim, state.original_length)
    return inv.numpy()


def method_factors(
    config: Any,
    method: str,
    target_length: int,
    options: dict[str, Any] | None = None,
    original_length: int | None = None,
) -> np.ndarray:
    """A named method's frequencies at ``target_length`` as per-dimension factors ``inv_freq_orig / inv_freq_method``.

    Args:
        config: the model's (unextended) config.
        method: a ctxext method (``linear``, ``ntk``, ``yarn``, ``llama3``, ``dynamic`` …).
        target_length: the target context.
        options: method options.
        original_length: overrides the pretraining length.

    Returns:
        ``d/2`` factors (float64).
    """
    state = read_rope(config, original_length=original_length)
    plan = plan_extension(config, method, target_length, options, original_length)
    inv, _ = reference_rope(plan.rope_parameters, state.rotary_dim, plan.max_position_embeddings, target_length)
    return base_inv_freq(state) / inv.numpy()


def _label(method: str, options: dict[str, Any]) -> str:
    if not options:
        return method
    inner = ",".join(f"{k}={v:g}" for k, v in options.items())
    return f"{method}({inner})"


# The named methods at their defaults: the baselines a searched result is compared with.
NAMED_METHODS: tuple[str, ...] = ("linear", "ntk", "yarn", "llama3")


def seed_grid(scale: float) -> list[tuple[str, dict[str, Any]]]:
    """The named methods and a small grid over each one's parameters.

    Args:
        scale: target / original length ``s``.

    Returns:
        ``(method, options)`` pairs, defaults first.
    """
    # The defaults first, so that a grid point equal to a default carries the default's name.
    grid: list[tuple[str, dict[str, Any]]] = [(m, {}) for m in NAMED_METHODS]
    for k in NTK_ALPHA_TIMES_S:
        if k * scale > 1:
            grid.append(("ntk", {"alpha": k * scale}))
    for fast, slow in itertools.product(YARN_BETA_FAST, YARN_BETA_SLOW):
        if fast > slow:
            grid.append(("yarn", {"beta_fast": fast, "beta_slow": slow}))
    for low, high in LLAMA3_LOW_HIGH:
        grid.append(("llama3", {"low_freq_factor": low, "high_freq_factor": high}))
    return grid


def seeds(config: Any, target_length: int, original_length: int | None = None) -> list[Seed]:
    """The search's seeds: every grid point as factors, duplicates (equal vectors) dropped.

    Args:
        config: the model's (unextended) config.
        target_length: the target context.
        original_length: overrides the pretraining length.

    Returns:
        The seeds, in grid order.

    Raises:
        RopeError: a seed that is not monotone (a reference bug, never expected).
    """
    state = read_rope(config, original_length=original_length)
    scale = target_length / state.original_length
    out: list[Seed] = []
    seen: set[tuple[float, ...]] = set()
    for method, options in seed_grid(scale):
        factors = method_factors(config, method, target_length, options, original_length)
        key = tuple(np.round(factors, 10))
        if key in seen:
            continue
        if not is_monotone(factors):
            raise RopeError(f"seed {_label(method, options)} is not monotone across dimensions: {factors}")
        seen.add(key)
        out.append(Seed(_label(method, options), method, dict(options), factors))
    return out

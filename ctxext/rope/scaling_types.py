"""One record per transformers rope type: the keys it reads, its value checks, its lengths, its reference.

transformers keeps one table per concern (``ROPE_INIT_FUNCTIONS``, the per-type validation functions); ctxext
keeps everything it knows about one rope type in one :class:`ScalingType` record, so adding or fixing a type
touches one place:

- ``keys``: the ``rope_parameters`` keys transformers reads for the type (besides ``rope_type``, ``rope_theta``
  and ``partial_rotary_factor``); anything else triggers an "Unrecognized keys" warning there.
- ``check``: the values transformers accepts with a mere warning and ctxext rejects.
- ``lengths``: how a config of this type states its original (pretraining) and current context.
- ``reference``: the inverse frequencies and attention scaling, computed in float64 independently of
  transformers' code (the formulas are in ``docs/methods.md``; where the papers leave a detail open, e.g.
  YaRN's ramp rounding, the reference follows transformers and says so).
- ``plan_problems``: what a plan's ``rope_parameters`` must say for the type to express the plan's intent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

import torch

from ctxext.rope.types import RopeConfigError, RopeError, RopePlan

# Shortest pretraining context of released RoPE models (LLaMA 1); used to read ambiguous linear configs.
MIN_PRETRAIN_LENGTH = 2048

Problems = dict[str, str]
Reference = tuple[torch.Tensor, float]


def finite(value: Any) -> TypeGuard[float]:
    """Whether ``value`` is a finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class ScalingType:
    """What ctxext knows about one transformers rope type.

    Attributes:
        name: the ``rope_type`` value.
        keys: the ``rope_parameters`` keys transformers reads for it.
        length_dependent: its frequencies depend on the length of the sequence being processed.
        reference: ``(params, rotary_dim, base_inv_freq, max_position_embeddings, seq_len) -> (inv_freq, scale)``.
        lengths: ``(max_position_embeddings, factor, params, notes, annotate) -> (original, current)``.
        check: adds the type's own problems to the dict it is given.
        plan_problems: what a plan's parameters of this type must state.
    """

    name: str
    keys: frozenset[str]
    reference: Callable[[dict[str, Any], int, torch.Tensor, int, int | None], Reference]
    lengths: Callable[[int, float, dict[str, Any], list[str], bool], tuple[int, int]]
    check: Callable[[dict[str, Any], int, int, Problems], None] = lambda params, d, max_pos, problems: None
    plan_problems: Callable[[RopePlan], list[str]] = lambda plan: []
    length_dependent: bool = False

    @property
    def has_original(self) -> bool:
        """The type states the pretraining length as ``original_max_position_embeddings``."""
        return "original_max_position_embeddings" in self.keys


# ---------------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------------


def base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    """``inv_freq_i = b^(-2i/d)``, ``i = 0 .. d/2-1``, in float64 as the ground truth."""
    i = torch.arange(dim // 2, dtype=torch.float64)
    return theta ** (-2.0 * i / dim)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    # YaRN §3.4: sqrt(1/t) = 0.1 ln(s) + 1 (the DeepSeek variant scales the log term by mscale).
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _max_pos_lengths(
    max_pos: int, factor: float, params: dict[str, Any], notes: list[str], annotate: bool
) -> tuple[int, int]:
    return max_pos, max_pos


def _original_key_lengths(
    max_pos: int, factor: float, params: dict[str, Any], notes: list[str], annotate: bool
) -> tuple[int, int]:
    # yarn, llama3, longrope: the original length is stated; the current context is max_position_embeddings, or
    # factor × original when a config kept max_position_embeddings at the original length (Qwen2.5's documented
    # YaRN recipe: 32768, factor 4 → 131072).
    original = int(params["original_max_position_embeddings"])
    current = max_pos
    if max_pos <= original and factor > 1:
        current = int(round(original * factor))
        notes.append(
            f"max_position_embeddings ({max_pos}) is not above the original length ({original}); the context is "
            f"read from the factor: {factor:g} × {original} = {current}"
        )
    return original, current


def _check_original(params: dict[str, Any], max_pos: int, problems: Problems, strict: bool) -> None:
    original = params.get("original_max_position_embeddings")
    if not isinstance(original, int) or original <= 0:
        problems["rope_parameters.original_max_position_embeddings"] = f"must be a positive integer, got {original!r}"
    elif original > max_pos or (strict and original >= max_pos):
        problems["rope_parameters.original_max_position_embeddings"] = (
            f"the original length ({original}) must be smaller than max_position_embeddings "
            f"({max_pos}); an extension cannot be shorter than the original context"
        )


def _check_needs_factor(name: str) -> Callable[[dict[str, Any], int, int, Problems], None]:
    def check(params: dict[str, Any], rotary_dim: int, max_pos: int, problems: Problems) -> None:
        if params.get("factor") is None:
            problems["rope_parameters.factor"] = f"rope type {name!r} needs a factor"

    return check


def _factor_problems(plan: RopePlan, rope_type: str) -> list[str]:
    factor = plan.rope_parameters.get("factor", 0)
    return (
        []
        if math.isclose(float(factor), plan.factor, rel_tol=1e-9)
        else [f"{rope_type} factor {factor} is not {plan.factor:g}"]
    )


def _original_plan_problems(plan: RopePlan) -> list[str]:
    p = plan.rope_parameters
    problems = []
    if int(p.get("original_max_position_embeddings", -1)) != plan.original_length:
        problems.append(f"original_max_position_embeddings is not the original length {plan.original_length}")
    problems += _factor_problems(plan, p["rope_type"])
    if plan.max_position_embeddings != plan.target_length:
        problems.append(f"max_position_embeddings {plan.max_position_embeddings} is not the target")
    return problems


# ---------------------------------------------------------------------------------------------
# default, linear, dynamic
# ---------------------------------------------------------------------------------------------


def _default_reference(
    params: dict[str, Any], d: int, base: torch.Tensor, max_pos: int, seq_len: int | None
) -> Reference:
    return base, 1.0


def _linear_reference(
    params: dict[str, Any], d: int, base: torch.Tensor, max_pos: int, seq_len: int | None
) -> Reference:
    # Position interpolation (Chen et al. 2023): positions divided by s ⇔ frequencies divided by s.
    return base / float(params["factor"]), 1.0


def _linear_lengths(
    max_pos: int, factor: float, params: dict[str, Any], notes: list[str], annotate: bool
) -> tuple[int, int]:
    # transformers ignores max_position_embeddings for linear, and checkpoints disagree on it: LongChat-16k writes
    # the *target* (16384, factor 8 → original 2048), Vicuna-v1.5-16k the *original* (4096, factor 4 → 16384).
    # Released RoPE models were pretrained at ≥ 2048 tokens, so when max_position_embeddings / factor falls below
    # 2048 while max_position_embeddings is at least 2048, it is taken as the original length; otherwise as the
    # target.
    if max_pos / factor < MIN_PRETRAIN_LENGTH <= max_pos:
        original, current = max_pos, int(round(max_pos * factor))
        reading = "the original length (Vicuna-v1.5-16k convention)"
    else:
        original, current = int(round(max_pos / factor)), max_pos
        reading = "the extended length (LongChat convention)"
    if annotate:
        notes.append(
            f"linear scaling: max_position_embeddings ({max_pos}) read as {reading}: original {original}, "
            f"context {current}; pass --original-length if the model was pretrained at another length"
        )
    return original, current


def _dynamic_reference(
    params: dict[str, Any], d: int, base: torch.Tensor, max_pos: int, seq_len: int | None
) -> Reference:
    # Dynamic NTK: base' = b·((s·T/M) − (s−1))^(d/(d−2)) for T > M, the NTK-aware base with s recomputed from the
    # current length; M is where transformers starts scaling.
    s = float(params["factor"])
    t = max(int(seq_len or 0), max_pos)
    new_base = float(params["rope_theta"]) * ((s * t / max_pos) - (s - 1)) ** (d / (d - 2))
    return base_inv_freq(new_base, d), 1.0


def _dynamic_lengths(
    max_pos: int, factor: float, params: dict[str, Any], notes: list[str], annotate: bool
) -> tuple[int, int]:
    # transformers starts scaling at max_position_embeddings: that is the original length.
    return max_pos, int(round(max_pos * factor))


def _dynamic_plan_problems(plan: RopePlan) -> list[str]:
    if plan.max_position_embeddings == plan.original_length:
        return []
    return [
        f"dynamic NTK with max_position_embeddings {plan.max_position_embeddings} ≠ original "
        f"{plan.original_length} runs unscaled up to max_position_embeddings"
    ]


# ---------------------------------------------------------------------------------------------
# yarn
# ---------------------------------------------------------------------------------------------


def _yarn_reference(params: dict[str, Any], d: int, base: torch.Tensor, max_pos: int, seq_len: int | None) -> Reference:
    # YaRN "NTK-by-parts" (Peng et al. 2023 §3.2): each dimension's wavelength λ_i = 2π/θ_i and r_i = L/λ_i
    # rotations within the original context. Dimensions that rotate more than β times keep their frequency
    # (extrapolation), fewer than α times are interpolated (÷ s), and a linear ramp joins them. The paper leaves
    # the ramp's placement open; the reference implementation and transformers place it linearly in the dimension
    # index between the dimensions where r = β and r = α (rounded outward unless ``truncate`` is false), and this
    # reference follows them, expressed through r.
    s = float(params["factor"])
    original = int(params["original_max_position_embeddings"])
    alpha = float(params.get("beta_slow") or 1.0)
    beta = float(params.get("beta_fast") or 32.0)
    theta = float(params["rope_theta"])

    def dim_where_rotations_equal(r: float) -> float:
        # Solve L·θ^(-2i/d) / (2π) = r for i.
        return d * math.log(original / (2 * math.pi * r)) / (2 * math.log(theta))

    lo, hi = dim_where_rotations_equal(beta), dim_where_rotations_equal(alpha)
    if params.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, d - 1)
    if lo == hi:
        hi += 0.001
    idx = torch.arange(d // 2, dtype=torch.float64)
    interpolate_weight = ((idx - lo) / (hi - lo)).clamp(0, 1)  # 0: keep, 1: divide by s
    inv_freq = base * (1 - interpolate_weight) + (base / s) * interpolate_weight
    att = params.get("attention_factor")
    if att is None:
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        if mscale and mscale_all:
            att = _yarn_mscale(s, mscale) / _yarn_mscale(s, mscale_all)
        else:
            att = _yarn_mscale(s)
    return inv_freq, float(att)


def _yarn_check(params: dict[str, Any], rotary_dim: int, max_pos: int, problems: Problems) -> None:
    fast = params.get("beta_fast", 32)
    slow = params.get("beta_slow", 1)
    fast, slow = (32 if fast is None else fast), (1 if slow is None else slow)
    for key, value in (("beta_fast", fast), ("beta_slow", slow)):
        if not finite(value) or value <= 0:
            problems[f"rope_parameters.{key}"] = (
                f"must be a finite number > 0 (rotations within the original context), got {value!r}"
            )
    if not problems and fast <= slow:
        problems["rope_parameters.beta_fast"] = (
            f"must be greater than beta_slow, got beta_fast={fast}, beta_slow={slow}"
        )
    att = params.get("attention_factor")
    if att is not None and (not finite(att) or att <= 0):
        problems["rope_parameters.attention_factor"] = f"must be a number > 0, got {att!r}"
    _check_original(params, max_pos, problems, strict=False)


# ---------------------------------------------------------------------------------------------
# llama3
# ---------------------------------------------------------------------------------------------


def _llama3_reference(
    params: dict[str, Any], d: int, base: torch.Tensor, max_pos: int, seq_len: int | None
) -> Reference:
    # Llama 3.1: wavelengths longer than L/low_freq_factor are divided by s, shorter than L/high_freq_factor kept,
    # and in between a smooth mix by (L/λ − low)/(high − low).
    s = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    original = float(params["original_max_position_embeddings"])
    wavelength = 2 * math.pi / base
    smooth = ((original / wavelength - low) / (high - low)).clamp(0, 1)
    inv_freq = (1 - smooth) * base / s + smooth * base
    inv_freq = torch.where(wavelength < original / high, base, inv_freq)
    inv_freq = torch.where(wavelength > original / low, base / s, inv_freq)
    return inv_freq, 1.0


def _llama3_check(params: dict[str, Any], rotary_dim: int, max_pos: int, problems: Problems) -> None:
    low, high = params.get("low_freq_factor"), params.get("high_freq_factor")
    if low is None or high is None:
        problems["rope_parameters.low_freq_factor"] = "llama3 needs low_freq_factor and high_freq_factor"
    elif not (finite(low) and finite(high) and low > 0):
        problems["rope_parameters.low_freq_factor"] = (
            f"low_freq_factor and high_freq_factor must be finite numbers > 0, got {low!r} and {high!r}"
        )
    elif low >= high:
        problems["rope_parameters.low_freq_factor"] = (
            f"must be smaller than high_freq_factor, got low_freq_factor={low}, high_freq_factor={high}"
        )
    _check_original(params, max_pos, problems, strict=True)


# ---------------------------------------------------------------------------------------------
# longrope
# ---------------------------------------------------------------------------------------------


def _longrope_reference(
    params: dict[str, Any], d: int, base: torch.Tensor, max_pos: int, seq_len: int | None
) -> Reference:
    original = int(params["original_max_position_embeddings"])
    factor = params.get("factor") or max_pos / original
    use_long = seq_len is not None and seq_len > original
    rescale = torch.tensor(params["long_factor" if use_long else "short_factor"], dtype=torch.float64)
    att = params.get("attention_factor")
    if att is None:
        # LongRoPE / Phi-3: sqrt(1 + ln(s) / ln(L)).
        att = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return base / rescale, float(att)


def _longrope_check(params: dict[str, Any], rotary_dim: int, max_pos: int, problems: Problems) -> None:
    for key in ("short_factor", "long_factor"):
        values = params.get(key)
        if not isinstance(values, (list, tuple)) or not all(isinstance(v, (int, float)) for v in values):
            problems[f"rope_parameters.{key}"] = f"must be a list of {rotary_dim // 2} numbers, got {values!r}"
        elif len(values) != rotary_dim // 2:
            problems[f"rope_parameters.{key}"] = (
                f"must have rotary_dim/2 = {rotary_dim // 2} entries, got {len(values)}"
            )
        elif any(not finite(v) or v <= 0 for v in values):
            problems[f"rope_parameters.{key}"] = "every rescale factor must be > 0"
    _check_original(params, max_pos, problems, strict=False)


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------

_ORIGINAL = "original_max_position_embeddings"

SCALING_TYPES: dict[str, ScalingType] = {
    t.name: t
    for t in (
        ScalingType("default", frozenset(), _default_reference, _max_pos_lengths),
        ScalingType(
            "linear",
            frozenset({"factor"}),
            _linear_reference,
            _linear_lengths,
            check=_check_needs_factor("linear"),
            plan_problems=lambda plan: _factor_problems(plan, "linear"),
        ),
        ScalingType(
            "dynamic",
            frozenset({"factor"}),
            _dynamic_reference,
            _dynamic_lengths,
            check=_check_needs_factor("dynamic"),
            plan_problems=_dynamic_plan_problems,
            length_dependent=True,
        ),
        ScalingType(
            "yarn",
            frozenset(
                {
                    "factor",
                    _ORIGINAL,
                    "attention_factor",
                    "beta_fast",
                    "beta_slow",
                    "mscale",
                    "mscale_all_dim",
                    "truncate",
                }
            ),
            _yarn_reference,
            _original_key_lengths,
            check=_yarn_check,
            plan_problems=_original_plan_problems,
        ),
        ScalingType(
            "longrope",
            frozenset({"factor", _ORIGINAL, "short_factor", "long_factor", "attention_factor"}),
            _longrope_reference,
            _original_key_lengths,
            check=_longrope_check,
            plan_problems=_original_plan_problems,
            length_dependent=True,
        ),
        ScalingType(
            "llama3",
            frozenset({"factor", _ORIGINAL, "low_freq_factor", "high_freq_factor"}),
            _llama3_reference,
            _original_key_lengths,
            check=_llama3_check,
            plan_problems=_original_plan_problems,
        ),
    )
}

# Rope types whose frequencies depend on the length of the sequence being processed. For every other type, one
# forward pass at the longest length gives every shorter length's scores.
LENGTH_DEPENDENT_TYPES = frozenset(name for name, t in SCALING_TYPES.items() if t.length_dependent)


def scaling_type(rope_type: str) -> ScalingType:
    """The record of a rope type.

    Raises:
        RopeError: a rope type neither ctxext nor transformers knows.
    """
    if rope_type not in SCALING_TYPES:
        raise RopeError(
            f"rope type {rope_type!r} is not one ctxext (or transformers) knows ({', '.join(sorted(SCALING_TYPES))}); "
            "fix rope_parameters.rope_type in the model's config.json"
        )
    return SCALING_TYPES[rope_type]


def check_rope_parameters(params: dict[str, Any], rotary_dim: int, max_position_embeddings: int) -> None:
    """Reject RoPE values that transformers accepts with a mere warning.

    Args:
        params: normalised rope parameters (see :func:`ctxext.rope.read.normalize_rope_parameters`).
        rotary_dim: the rotary dimension ``d``.
        max_position_embeddings: the config's ``max_position_embeddings``.

    Raises:
        RopeConfigError: naming every bad field at once.
    """
    problems: Problems = {}
    rope_type = params.get("rope_type", "default")
    if rope_type not in SCALING_TYPES:
        problems["rope_parameters.rope_type"] = (
            f"unknown rope type {rope_type!r}; known: {', '.join(sorted(SCALING_TYPES))}"
        )
        raise RopeConfigError(problems)
    spec = SCALING_TYPES[rope_type]
    theta = params.get("rope_theta")
    if not finite(theta) or theta <= 1:
        problems["rope_parameters.rope_theta"] = f"must be a number > 1, got {theta!r}"
    if rotary_dim < 2 or rotary_dim % 2:
        problems["rotary_dim"] = f"the rotary dimension must be even and ≥ 2, got {rotary_dim}"
    factor = params.get("factor")
    if "factor" in spec.keys and factor is not None and (not finite(factor) or factor < 1):
        problems["rope_parameters.factor"] = f"must be a number ≥ 1 (target length / original length), got {factor!r}"
    spec.check(params, rotary_dim, max_position_embeddings, problems)
    if problems:
        raise RopeConfigError(problems)


def reference_rope(
    params: dict[str, Any], rotary_dim: int, max_position_embeddings: int, seq_len: int | None = None
) -> Reference:
    """Compute, independently of transformers' code, ``inv_freq`` and the attention scaling of a RoPE setting.

    Written from the formulas in ``docs/methods.md`` without calling transformers, so a change in transformers'
    frequencies is caught instead of copied. Where a paper and transformers differ, the formula is transformers'
    convention, the one a user's model runs: the YaRN ramp is linear in the dimension index (as in transformers and
    the YaRN reference code), dynamic NTK uses transformers' ``factor`` form, and Llama 3 follows transformers'
    formula (the one ``docs/methods.md`` cites). ``tests/unit/rope/test_rope.py`` checks the YaRN paper's invariants
    separately.

    Args:
        params: normalised rope parameters.
        rotary_dim: rotary dimension ``d``.
        max_position_embeddings: the config's ``max_position_embeddings``.
        seq_len: the length of the sequence being processed; matters only for ``dynamic`` and ``longrope``.

    Returns:
        ``(inv_freq, attention_scaling)``: a float64 tensor of ``d/2`` frequencies and the factor that cos/sin are
        multiplied by.
    """
    spec = scaling_type(params["rope_type"])
    base = base_inv_freq(float(params["rope_theta"]), rotary_dim)
    return spec.reference(params, rotary_dim, base, max_position_embeddings, seq_len)

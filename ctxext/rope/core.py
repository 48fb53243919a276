"""RoPE context-extension methods, an independent frequency reference, and runtime verification.

Three jobs live here, because they must agree with each other:

1. **Reading** a model config's RoPE, in the transformers-5 form (``rope_parameters``) or the
   legacy form (``rope_theta`` + ``rope_scaling`` with ``type`` or ``rope_type``), into a
   :class:`RopeState` that says what the model *is*: base theta, scaling, original and current
   context.
2. **Extending**: planning an extension with a method of the registry (:mod:`ctxext.rope.methods`, one
   module per method), which turns (state, target length, options) into standard ``rope_parameters`` +
   ``max_position_embeddings`` that vanilla transformers loads correctly; checking the plan's intent.
3. **Verifying**: ctxext's own reference of every method's inverse frequencies and attention
   scaling, written from the papers' formulas, compared with what the model's rotary modules
   actually compute at run time. Silently unscaled RoPE is the most reported failure in this
   field; this check is what catches it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, TypeGuard

import torch

# Re-exported with `as` (the names have always been importable from ctxext.rope.core).
from ctxext.rope.methods import METHODS as METHODS
from ctxext.rope.methods import RopeMethod as RopeMethod
from ctxext.rope.methods import get_method as get_method
from ctxext.rope.methods import register_method as register_method
from ctxext.rope.methods.longrope import load_factors_file as load_factors_file
from ctxext.rope.types import RopeConfigError as RopeConfigError
from ctxext.rope.types import RopeError as RopeError
from ctxext.rope.types import RopeMismatchError as RopeMismatchError
from ctxext.rope.types import RopePlan as RopePlan
from ctxext.rope.types import RopeState as RopeState

# Rope types whose frequencies depend on the length of the sequence being processed. For every
# other type, one forward pass at the longest length gives every shorter length's scores.
LENGTH_DEPENDENT_TYPES = frozenset({"dynamic", "longrope"})

# Keys of ``rope_parameters`` that transformers reads for each rope type (besides rope_type,
# rope_theta and partial_rotary_factor). Anything else triggers an "Unrecognized keys" warning.
_TYPE_KEYS: dict[str, set[str]] = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "yarn": {
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    },
    "longrope": {
        "factor",
        "original_max_position_embeddings",
        "short_factor",
        "long_factor",
        "attention_factor",
    },
    "llama3": {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"},
}

# Shortest pretraining context of released RoPE models (LLaMA 1); used to read ambiguous linear configs.
_MIN_PRETRAIN_LENGTH = 2048

# Absolute and relative tolerance between ctxext's float64 reference and the runtime float32 values.
_RTOL = 1e-4
_ATOL = 1e-9


# ---------------------------------------------------------------------------------------------
# Reading a config
# ---------------------------------------------------------------------------------------------


def _text_config(config: Any) -> Any:
    # Multimodal configs nest the language model's settings; RoPE lives there.
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def _head_dim(config: Any) -> int:
    head_dim = getattr(config, "head_dim", None)
    if head_dim:
        return int(head_dim)
    return int(config.hidden_size // config.num_attention_heads)


def normalize_rope_parameters(config: Any) -> dict[str, Any]:
    """Return the config's RoPE parameters as one flat dict with ``rope_type`` and ``rope_theta``.

    Accepts transformers-5 ``rope_parameters`` and legacy ``rope_scaling`` / ``rope_theta`` (with
    ``type`` or ``rope_type``).

    Args:
        config: a transformers ``PretrainedConfig``.

    Returns:
        A new dict; the config is not modified.

    Raises:
        RopeError: the model has no rotary position embedding, or uses per-layer RoPE settings.
    """
    config = _text_config(config)
    params = getattr(config, "rope_parameters", None)
    legacy = getattr(config, "rope_scaling", None)
    theta = getattr(config, "rope_theta", None)
    if not params and not legacy and theta is None:
        model_type = getattr(config, "model_type", "this model")
        raise RopeError(
            f"{model_type} has no rotary position embedding (no rope_parameters, rope_scaling or rope_theta in "
            "its config); ctxext extends RoPE models only (Llama, Mistral, Qwen2, Gemma, Phi-3 …). A model with "
            "learned absolute positions (GPT-2, OPT) cannot be extended by rescaling RoPE."
        )
    merged: dict[str, Any] = dict(params or {})
    if legacy and legacy is not params:
        merged.update(legacy)
    if any(isinstance(v, dict) for v in merged.values()):
        raise RopeError(
            "this model sets RoPE per layer type (nested rope_parameters, e.g. Gemma 3); ctxext supports one "
            "global RoPE setting per model for now."
        )
    rope_type = merged.pop("rope_type", None) or merged.pop("type", None) or "default"
    merged.pop("type", None)
    merged["rope_type"] = rope_type
    if merged.get("rope_theta") is None:
        merged["rope_theta"] = float(theta if theta is not None else getattr(config, "default_theta", 10000.0))
    prf = getattr(config, "partial_rotary_factor", None)
    if prf is not None and "partial_rotary_factor" not in merged:
        merged["partial_rotary_factor"] = prf
    top_level_original = getattr(config, "original_max_position_embeddings", None)
    if rope_type in ("yarn", "llama3", "longrope") and "original_max_position_embeddings" not in merged:
        merged["original_max_position_embeddings"] = int(top_level_original or config.max_position_embeddings)
    return merged


def read_rope(config: Any, original_length: int | None = None) -> RopeState:
    """Describe a config's RoPE: type, base, original and current context.

    How the original (pretraining) length is found, by rope type:

    - ``yarn``, ``llama3``, ``longrope``: ``rope_parameters.original_max_position_embeddings``; the
      current context is ``max_position_embeddings``, or ``factor × original`` when a config kept
      ``max_position_embeddings`` at the original length (Qwen2.5's documented YaRN recipe: 32768,
      factor 4 → 131072).
    - ``dynamic``: ``max_position_embeddings`` (transformers starts scaling there); the current
      context is ``factor × max_position_embeddings``.
    - ``linear``: transformers ignores ``max_position_embeddings`` here, and checkpoints disagree on
      it: LongChat-16k writes the *target* (16384, factor 8 → original 2048), Vicuna-v1.5-16k the
      *original* (4096, factor 4 → 16384). Released RoPE models were pretrained at ≥ 2048 tokens, so
      when ``max_position_embeddings / factor`` falls below 2048 while ``max_position_embeddings``
      is at least 2048, ``max_position_embeddings`` is taken as the original length; otherwise as
      the target. A note says which reading was used; ``original_length`` overrides it.
    - ``default`` (incl. raised theta, e.g. Code Llama): ``max_position_embeddings``.

    A folder written by ``ctxext extend`` records both lengths under ``config.ctxext``, which wins.

    Args:
        config: a transformers ``PretrainedConfig``.
        original_length: overrides the pretraining length when the config cannot tell it.

    Returns:
        The :class:`RopeState`.
    """
    if original_length is not None and (isinstance(original_length, bool) or int(original_length) <= 0):
        raise RopeError(
            f"--original-length {original_length}: must be a positive number of tokens (the pretraining context)"
        )
    text = _text_config(config)
    params = normalize_rope_parameters(text)
    rope_type = params["rope_type"]
    bad = {
        key: f"must be a finite number, got {value!r}"
        for key, value in (
            ("max_position_embeddings", getattr(text, "max_position_embeddings", None)),
            ("rope_parameters.rope_theta", params.get("rope_theta")),
            ("rope_parameters.factor", params.get("factor")),
            ("rope_parameters.original_max_position_embeddings", params.get("original_max_position_embeddings")),
        )
        # factor and the original length may be absent (None); the base and the context may not.
        if not _finite(value)
        and (value is not None or key in ("max_position_embeddings", "rope_parameters.rope_theta"))
    }
    if bad:
        raise RopeConfigError(bad)
    max_pos = int(text.max_position_embeddings)
    factor = float(params.get("factor") or 1.0)
    meta = getattr(text, "ctxext", None) or {}
    notes: list[str] = []
    if rope_type in ("yarn", "llama3", "longrope"):
        original = int(params["original_max_position_embeddings"])
        current = max_pos
        if max_pos <= original and factor > 1:
            current = int(round(original * factor))
            notes.append(
                f"max_position_embeddings ({max_pos}) is not above the original length ({original}); the context is "
                f"read from the factor: {factor:g} × {original} = {current}"
            )
    elif rope_type == "dynamic":
        original = max_pos
        current = int(round(max_pos * factor))
    elif rope_type == "linear":
        if max_pos / factor < _MIN_PRETRAIN_LENGTH <= max_pos:
            original, current = max_pos, int(round(max_pos * factor))
            reading = "the original length (Vicuna-v1.5-16k convention)"
        else:
            original, current = int(round(max_pos / factor)), max_pos
            reading = "the extended length (LongChat convention)"
        if original_length is None and not meta:
            notes.append(
                f"linear scaling: max_position_embeddings ({max_pos}) read as {reading}: original {original}, "
                f"context {current}; pass --original-length if the model was pretrained at another length"
            )
    else:
        original = max_pos
        current = max_pos
    if isinstance(meta, dict):
        original = int(meta.get("original_length", original))
        current = int(meta.get("target_length", current))
    if original_length is not None:
        if rope_type == "linear" and not meta:
            current = int(round(original_length * factor))
        original = int(original_length)
        if rope_type == "default" and not meta:
            # Unscaled RoPE works up to its pretraining length, whatever max_position_embeddings
            # claims (Mistral 7B v0.1 says 32768 but was trained at 8192).
            current = original
    head_dim = _head_dim(text)
    rotary_dim = int(head_dim * float(params.get("partial_rotary_factor") or 1.0))
    return RopeState(
        model_type=str(getattr(text, "model_type", "unknown")),
        rope_type=rope_type,
        rope_theta=float(params["rope_theta"]),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        original_length=original,
        current_length=current,
        max_position_embeddings=max_pos,
        parameters=params,
        notes=notes,
        extension=dict(meta) if isinstance(meta, dict) else {},
    )


# ---------------------------------------------------------------------------------------------
# Checking values that transformers only warns about
# ---------------------------------------------------------------------------------------------


def _finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_rope_parameters(params: dict[str, Any], rotary_dim: int, max_position_embeddings: int) -> None:
    """Reject RoPE values that transformers accepts with a mere warning.

    Args:
        params: normalised rope parameters (see :func:`normalize_rope_parameters`).
        rotary_dim: the rotary dimension ``d``.
        max_position_embeddings: the config's ``max_position_embeddings``.

    Raises:
        RopeConfigError: naming every bad field at once.
    """
    problems: dict[str, str] = {}
    rope_type = params.get("rope_type", "default")
    if rope_type not in _TYPE_KEYS:
        problems["rope_parameters.rope_type"] = (
            f"unknown rope type {rope_type!r}; known: {', '.join(sorted(_TYPE_KEYS))}"
        )
        raise RopeConfigError(problems)
    theta = params.get("rope_theta")
    if not _finite(theta) or theta <= 1:
        problems["rope_parameters.rope_theta"] = f"must be a number > 1, got {theta!r}"
    if rotary_dim < 2 or rotary_dim % 2:
        problems["rotary_dim"] = f"the rotary dimension must be even and ≥ 2, got {rotary_dim}"
    factor = params.get("factor")
    if "factor" in _TYPE_KEYS[rope_type] and factor is not None:
        if not _finite(factor) or factor < 1:
            problems["rope_parameters.factor"] = (
                f"must be a number ≥ 1 (target length / original length), got {factor!r}"
            )
    if rope_type in ("linear", "dynamic") and factor is None:
        problems["rope_parameters.factor"] = f"rope type {rope_type!r} needs a factor"
    if rope_type == "yarn":
        fast = params.get("beta_fast", 32)
        slow = params.get("beta_slow", 1)
        fast, slow = (32 if fast is None else fast), (1 if slow is None else slow)
        for key, value in (("beta_fast", fast), ("beta_slow", slow)):
            if not _finite(value) or value <= 0:
                problems[f"rope_parameters.{key}"] = (
                    f"must be a finite number > 0 (rotations within the original context), got {value!r}"
                )
        if not problems and fast <= slow:
            problems["rope_parameters.beta_fast"] = (
                f"must be greater than beta_slow, got beta_fast={fast}, beta_slow={slow}"
            )
        att = params.get("attention_factor")
        if att is not None and (not _finite(att) or att <= 0):
            problems["rope_parameters.attention_factor"] = f"must be a number > 0, got {att!r}"
    if rope_type == "llama3":
        low, high = params.get("low_freq_factor"), params.get("high_freq_factor")
        if low is None or high is None:
            problems["rope_parameters.low_freq_factor"] = "llama3 needs low_freq_factor and high_freq_factor"
        elif not (_finite(low) and _finite(high) and low > 0):
            problems["rope_parameters.low_freq_factor"] = (
                f"low_freq_factor and high_freq_factor must be finite numbers > 0, got {low!r} and {high!r}"
            )
        elif low >= high:
            problems["rope_parameters.low_freq_factor"] = (
                f"must be smaller than high_freq_factor, got low_freq_factor={low}, high_freq_factor={high}"
            )
    if rope_type == "longrope":
        for key in ("short_factor", "long_factor"):
            values = params.get(key)
            if not isinstance(values, (list, tuple)) or not all(isinstance(v, (int, float)) for v in values):
                problems[f"rope_parameters.{key}"] = f"must be a list of {rotary_dim // 2} numbers, got {values!r}"
            elif len(values) != rotary_dim // 2:
                problems[f"rope_parameters.{key}"] = (
                    f"must have rotary_dim/2 = {rotary_dim // 2} entries, got {len(values)}"
                )
            elif any(not _finite(v) or v <= 0 for v in values):
                problems[f"rope_parameters.{key}"] = "every rescale factor must be > 0"
    if rope_type in ("yarn", "llama3", "longrope"):
        original = params.get("original_max_position_embeddings")
        if not isinstance(original, int) or original <= 0:
            problems["rope_parameters.original_max_position_embeddings"] = (
                f"must be a positive integer, got {original!r}"
            )
        elif original > max_position_embeddings or (rope_type == "llama3" and original >= max_position_embeddings):
            problems["rope_parameters.original_max_position_embeddings"] = (
                f"the original length ({original}) must be smaller than max_position_embeddings "
                f"({max_position_embeddings}); an extension cannot be shorter than the original context"
            )
    if problems:
        raise RopeConfigError(problems)


# ---------------------------------------------------------------------------------------------
# The independent reference: inverse frequencies and attention scaling, from the papers
# ---------------------------------------------------------------------------------------------


def _base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    # inv_freq_i = b^(-2i/d), i = 0 .. d/2-1, computed in float64 as the ground truth.
    i = torch.arange(dim // 2, dtype=torch.float64)
    return theta ** (-2.0 * i / dim)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    # YaRN §3.4: sqrt(1/t) = 0.1 ln(s) + 1 (the DeepSeek variant scales the log term by mscale).
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def reference_rope(
    params: dict[str, Any], rotary_dim: int, max_position_embeddings: int, seq_len: int | None = None
) -> tuple[torch.Tensor, float]:
    """Compute, independently of transformers, ``inv_freq`` and the attention scaling of a RoPE setting.

    Written from the papers (formulas in ``docs/methods.md``), not from transformers, so a disagreement between the
    two is caught instead of copied.

    Args:
        params: normalised rope parameters.
        rotary_dim: rotary dimension ``d``.
        max_position_embeddings: the config's ``max_position_embeddings``.
        seq_len: the length of the sequence being processed; matters only for ``dynamic`` and ``longrope``.

    Returns:
        ``(inv_freq, attention_scaling)``: a float64 tensor of ``d/2`` frequencies and the factor
        that cos/sin are multiplied by.
    """
    rope_type = params["rope_type"]
    d = rotary_dim
    b = float(params["rope_theta"])
    base = _base_inv_freq(b, d)
    if rope_type == "default":
        return base, 1.0
    if rope_type == "linear":
        # Position interpolation (Chen et al. 2023): positions divided by s ⇔ frequencies divided by s.
        return base / float(params["factor"]), 1.0
    if rope_type == "dynamic":
        # Dynamic NTK: base' = b·((s·T/M) − (s−1))^(d/(d−2)) for T > M, the NTK-aware base with s
        # recomputed from the current length; M is where transformers starts scaling.
        s = float(params["factor"])
        t = max(int(seq_len or 0), max_position_embeddings)
        new_base = b * ((s * t / max_position_embeddings) - (s - 1)) ** (d / (d - 2))
        return _base_inv_freq(new_base, d), 1.0
    if rope_type == "yarn":
        return _reference_yarn(params, d, base)
    if rope_type == "llama3":
        return _reference_llama3(params, base)
    if rope_type == "longrope":
        original = int(params["original_max_position_embeddings"])
        factor = params.get("factor") or max_position_embeddings / original
        use_long = seq_len is not None and seq_len > original
        rescale = torch.tensor(params["long_factor" if use_long else "short_factor"], dtype=torch.float64)
        att = params.get("attention_factor")
        if att is None:
            # LongRoPE / Phi-3: sqrt(1 + ln(s) / ln(L)).
            att = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        return base / rescale, float(att)
    raise RopeError(
        f"rope type {rope_type!r} is not one ctxext (or transformers) knows ({', '.join(sorted(_TYPE_KEYS))}); fix "
        "rope_parameters.rope_type in the model's config.json"
    )


def _reference_yarn(params: dict[str, Any], d: int, base: torch.Tensor) -> tuple[torch.Tensor, float]:
    # YaRN "NTK-by-parts" (Peng et al. 2023 §3.2): each dimension's wavelength λ_i = 2π/θ_i and
    # r_i = L/λ_i rotations within the original context. Dimensions that rotate more than β times
    # keep their frequency (extrapolation), fewer than α times are interpolated (÷ s), and a linear
    # ramp joins them. The reference implementation (and transformers) places the ramp linearly in
    # the dimension index between the dimensions where r = β and r = α (rounded outward unless
    # ``truncate`` is false); we express exactly that, through r.
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


def _reference_llama3(params: dict[str, Any], base: torch.Tensor) -> tuple[torch.Tensor, float]:
    # Llama 3.1: wavelengths longer than L/low_freq_factor are divided by s, shorter than
    # L/high_freq_factor kept, and in between a smooth mix by (L/λ − low)/(high − low).
    s = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    original = float(params["original_max_position_embeddings"])
    wavelength = 2 * math.pi / base
    smooth = ((original / wavelength - low) / (high - low)).clamp(0, 1)
    inv_freq = (1 - smooth) * base / s + smooth * base
    inv_freq = torch.where(wavelength < original / high, base, inv_freq)
    inv_freq = torch.where(wavelength > original / low, base / s, inv_freq)
    return inv_freq, 1.0


# ---------------------------------------------------------------------------------------------
# Planning an extension (each method is declared in its own module of ctxext.rope.methods)
# ---------------------------------------------------------------------------------------------


RELATIVE_TO = ("original", "current")


def describe_extension(state: RopeState) -> str | None:
    """What the model already is, if it is extended (a ctxext extension, or a scaled rope type); else ``None``."""
    meta = state.extension
    if meta.get("method"):
        base_theta = (meta.get("base_rope_parameters") or {}).get("rope_theta")
        theta = (
            f", rope_theta {base_theta:g} → {state.rope_theta:g}"
            if base_theta and base_theta != state.rope_theta
            else ""
        )
        return f"extended by ctxext with {meta['method']} from {state.original_length} to {state.current_length}{theta}"
    if state.rope_type != "default":
        return (
            f"already scaled: {state.rope_type} ×{state.factor:g} ({state.original_length} → {state.current_length} "
            "tokens), and was most likely trained with it"
        )
    return None


def _base_state(state: RopeState) -> RopeState:
    # The unscaled RoPE an extension started from: ctxext's record, or the scaled config without its scaling.
    base = dict(state.extension.get("base_rope_parameters") or {})
    if base.get("rope_type", "default") != "default":
        return _base_state(replace(state, rope_type=base["rope_type"], parameters=base, extension={}))
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": float(base.get("rope_theta", state.rope_theta))}
    prf = base.get("partial_rotary_factor", state.parameters.get("partial_rotary_factor"))
    if prf is not None:
        params["partial_rotary_factor"] = prf
    return replace(
        state,
        rope_type="default",
        rope_theta=params["rope_theta"],
        parameters=params,
        current_length=state.original_length,
    )


def _changes(old: RopeState, plan: RopePlan) -> str:
    # What replacing an existing scaling changes, measured at the target length.
    seq = plan.target_length
    old_f, old_att = reference_rope(old.parameters, old.rotary_dim, old.max_position_embeddings, seq)
    new_f, new_att = reference_rope(plan.rope_parameters, plan.rotary_dim, plan.max_position_embeddings, seq)
    moved = int(((new_f - old_f).abs() / old_f > 0.01).sum())
    text = f"{moved} of {old.rotary_dim // 2} rotary frequencies change by more than 1 %"
    if not math.isclose(old_att, new_att, rel_tol=1e-6):
        text += f", and the attention scaling goes from {old_att:.4g} to {new_att:.4g}"
    return text


def plan_extension(
    config: Any,
    method: str,
    target_length: int,
    options: dict[str, Any] | None = None,
    original_length: int | None = None,
    relative_to: str | None = None,
) -> RopePlan:
    """Compute the RoPE settings that extend ``config`` to ``target_length`` with ``method``.

    For an unscaled model the factor is ``target_length / original_length``. A model that is already
    extended (by ctxext, or a scaled config such as Llama 3.1's llama3 ×8) is never scaled twice
    silently: ``relative_to`` must say how to compose, otherwise a :class:`RopeError` explains both
    choices.

    - ``"original"``: replace the existing extension. Start from the unscaled base RoPE (ctxext's
      record of the base ``rope_theta``, or the config without its scaling) and scale from the
      pretraining length. The plan's notes say what changes for the model (frequencies, attention
      temperature).
    - ``"current"``: stack on the current state. The model as it is (its ``rope_theta``, its context)
      is treated as the new base, and the factor is ``target / current``. Only unscaled (e.g. NTK- or
      theta-extended) models and linear-on-linear compose this way; transformers holds one scaling per
      model, so other combinations are refused.

    Args:
        config: the model's config (not modified).
        method: a name in :data:`METHODS`.
        target_length: the new context length.
        options: method options, as the method declares them (``beta_fast``, ``low_freq_factor``, ``rope_theta``,
            ``factors_file`` …); ``None`` values count as not given.
        original_length: overrides the pretraining length read from the config.
        relative_to: ``None``, ``"original"`` or ``"current"`` (see above).

    Returns:
        The :class:`RopePlan`.

    Raises:
        RopeError: unknown method, unknown option, a target not above the current context, bad values,
            or an already-extended model without ``relative_to``.
    """
    spec = get_method(method)
    if relative_to is not None and relative_to not in RELATIVE_TO:
        raise RopeError(f"--relative-to {relative_to!r}: choose one of {', '.join(RELATIVE_TO)}")
    values = spec.resolve(options or {})  # the declared options: given (converted, checked) or default
    current = read_rope(config, original_length=original_length)
    check_rope_parameters(current.parameters, current.rotary_dim, current.max_position_embeddings)
    if target_length <= current.current_length:
        raise RopeError(
            f"target length {target_length} is not above the model's current context ({current.current_length}); "
            f"choose a target longer than {current.current_length} (the model's original length is "
            f"{current.original_length})."
        )
    existing = describe_extension(current)
    state, composed_on = current, {}
    if existing and relative_to is None:
        raise RopeError(
            f"this model is {existing}. Extending it again must not scale it twice by accident; say how to compose "
            "(`ctxext extend --relative-to original|current`; in a recipe, rope.relative_to: original|current):\n"
            f"  original: replace that extension: {method} from the unscaled base RoPE, "
            f"{current.original_length} → {target_length} (×{target_length / current.original_length:g});\n"
            f"  current: keep it and stack {method} on top, {current.current_length} → {target_length} "
            f"(×{target_length / current.current_length:g}); possible for NTK/theta-extended models and linear on "
            "linear only."
        )
    if existing and relative_to == "original":
        state = _base_state(current)
    elif existing and relative_to == "current":
        composable = current.rope_type == "default" or (current.rope_type == method == "linear")
        if not composable:
            raise RopeError(
                f"relative_to current: {method} cannot be stacked on {current.rope_type} scaling; transformers "
                "holds one RoPE scaling per model. Replace it instead (`ctxext extend --relative-to original`; in a "
                "recipe, rope.relative_to: original)."
            )
        composed_on = dict(current.extension) or {"rope_parameters": dict(current.parameters)}
        if current.rope_type == "linear":
            # Linear on linear is one linear scaling by the product of the factors: relative to the original.
            state = _base_state(current)
        else:
            params = {
                k: v for k, v in current.parameters.items() if k in ("rope_type", "rope_theta", "partial_rotary_factor")
            }
            state = replace(current, original_length=current.current_length, parameters=params, extension={})
    s = target_length / state.original_length
    plan = spec.plan(state, target_length, s, values)
    plan.composed_on = composed_on
    check_rope_parameters(plan.rope_parameters, state.rotary_dim, plan.max_position_embeddings)
    if (
        plan.rope_parameters["rope_type"] not in ("default", "dynamic")
        and plan.original_length >= plan.max_position_embeddings
    ):
        raise RopeConfigError(
            {
                "original_max_position_embeddings": (
                    f"original length {plan.original_length} ≥ new max {plan.max_position_embeddings}"
                )
            }
        )
    check_plan_intent(plan)
    if existing:
        plan.notes.append(f"the model was {existing}; {_changes(current, plan)} (relative to {relative_to})")
    return plan


def check_plan_intent(plan: RopePlan) -> None:
    """Check that a plan's ``rope_parameters`` express its intent: method, factor, original and target length.

    The plan's parameters come from the method's builder; this re-derives what they must say from the
    plan's own numbers (``factor = target / original`` and the method's defining relation), so a builder
    that writes something else cannot produce a "verified" model.

    Args:
        plan: from :func:`plan_extension`.

    Raises:
        RopeMismatchError: naming the first disagreement.
    """
    p, s = plan.rope_parameters, plan.factor
    problems = []
    if not math.isclose(s, plan.target_length / plan.original_length, rel_tol=1e-9):
        problems.append(f"factor {s:g} is not target/original = {plan.target_length}/{plan.original_length}")
    rope_type = p.get("rope_type")
    if rope_type in ("yarn", "llama3", "longrope"):
        if int(p.get("original_max_position_embeddings", -1)) != plan.original_length:
            problems.append(f"original_max_position_embeddings is not the original length {plan.original_length}")
        if not math.isclose(float(p.get("factor", 0)), s, rel_tol=1e-9):
            problems.append(f"{rope_type} factor {p.get('factor')} is not {s:g}")
        if plan.max_position_embeddings != plan.target_length:
            problems.append(f"max_position_embeddings {plan.max_position_embeddings} is not the target")
    if rope_type == "linear" and not math.isclose(float(p.get("factor", 0)), s, rel_tol=1e-9):
        problems.append(f"linear factor {p.get('factor')} is not {s:g}")
    if rope_type == "dynamic" and plan.max_position_embeddings != plan.original_length:
        problems.append(
            f"dynamic NTK with max_position_embeddings {plan.max_position_embeddings} ≠ original "
            f"{plan.original_length} runs unscaled up to max_position_embeddings"
        )
    if plan.method in METHODS:
        problems += METHODS[plan.method].intent_problems(plan)
    if problems:
        raise RopeMismatchError(f"the {plan.method} plan does not match its intent: " + "; ".join(problems))


def apply_plan(config: Any, plan: RopePlan) -> None:
    """Write a plan into a config in place (standard fields, plus ``config.ctxext`` metadata).

    Args:
        config: the config to modify.
        plan: from :func:`plan_extension`.
    """
    text = _text_config(config)
    text.rope_parameters = dict(plan.rope_parameters)
    text.max_position_embeddings = plan.max_position_embeddings
    # Phi-3 style configs keep the pretraining length at top level, and transformers prefers it.
    if getattr(text, "original_max_position_embeddings", None) is not None:
        text.original_max_position_embeddings = plan.original_length
    text.ctxext = {
        "method": plan.method,
        "original_length": plan.original_length,
        "target_length": plan.target_length,
        "factor": plan.factor,
        # The RoPE the extension started from: re-extending restarts from it (--relative-to original).
        "base_rope_parameters": dict(plan.base_parameters),
    }
    if plan.composed_on:
        text.ctxext["composed_on"] = dict(plan.composed_on)


def legacy_fields(rope_parameters: dict[str, Any]) -> dict[str, Any]:
    """The pre-transformers-5 form of ``rope_parameters``, for older consumers.

    Args:
        rope_parameters: standard parameters.

    Returns:
        ``{"rope_theta": ..., "rope_scaling": {...}, "partial_rotary_factor": ...}``; ``rope_scaling``
        carries every RoPE key, with both ``type`` and ``rope_type`` because readers disagree on the key
        (transformers#32916).
    """
    # transformers 5 reads ``rope_scaling`` as an alias of ``rope_parameters``: a ``rope_scaling`` that
    # lacks a key (partial_rotary_factor, rope_theta) makes it fall back to the class default on reload
    # (a Phi model's 0.4 became 0.5). So every key is written in both places, and at top level too.
    scaling = dict(rope_parameters)
    scaling["type"] = scaling.get("rope_type", "default")
    # Unscaled RoPE has no rope_scaling in the old format (transformers < 4.43 rejects type "default").
    unscaled = scaling["type"] == "default"
    out: dict[str, Any] = {"rope_theta": rope_parameters["rope_theta"], "rope_scaling": None if unscaled else scaling}
    if rope_parameters.get("partial_rotary_factor") is not None:
        out["partial_rotary_factor"] = rope_parameters["partial_rotary_factor"]
    return out


# ---------------------------------------------------------------------------------------------
# Runtime: finding, rebuilding and verifying the rotary modules of a model
# ---------------------------------------------------------------------------------------------


def rotary_modules(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module]]:
    """Yield ``(name, module)`` for every rotary embedding module of a model.

    Args:
        model: a transformers model (possibly wrapped by peft).

    Yields:
        Modules that carry an ``inv_freq`` buffer.
    """
    for name, module in model.named_modules():
        if hasattr(module, "inv_freq") and isinstance(getattr(module, "inv_freq", None), torch.Tensor):
            yield name, module


def rebuild_rotary(model: torch.nn.Module) -> int:
    """Rebuild every rotary module of a loaded model from its (patched) config.

    In transformers 5 a rotary module computes its frequencies once, in ``__init__``; changing
    ``model.config`` afterwards changes nothing at run time.

    Args:
        model: the model whose config has been patched.

    Returns:
        The number of modules rebuilt.

    Raises:
        RopeError: the model has no rotary module.
    """
    config = _text_config(model.config)
    rebuilt = 0
    for name, module in list(rotary_modules(model)):
        # A tensor buffer (rotary_modules checked), which nn.Module types as Tensor | Module.
        device: torch.device = module.inv_freq.device  # type: ignore[assignment]
        try:
            fresh = type(module)(config=config, device=device)
        except TypeError:
            fresh = type(module)(config=config).to(device)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, fresh)
        rebuilt += 1
    if not rebuilt:
        raise RopeError(f"{type(model).__name__} has no rotary embedding module (no inv_freq buffer) to rebuild")
    return rebuilt


def reset_dynamic_rope(model: torch.nn.Module) -> None:
    """Return length-dependent rotary modules to their short-sequence state.

    transformers' dynamic NTK keeps the frequencies of the longest sequence seen so far for any
    later sequence that is still longer than the original length; an evaluator that scores several
    lengths must reset between them or its numbers depend on the order of the work.

    Args:
        model: a model with rotary modules.
    """
    for _, module in rotary_modules(model):
        original = getattr(module, "original_inv_freq", None)
        if original is not None:
            module.inv_freq = original.clone().to(module.inv_freq.device)
        if hasattr(module, "original_max_seq_len"):
            module.max_seq_len_cached = module.original_max_seq_len
        if hasattr(module, "long_inv_freq"):
            module.long_inv_freq = None  # type: ignore[assignment]  # a buffer may be None; torch's stubs say not


def _runtime_values(module: torch.nn.Module, seq_len: int) -> tuple[torch.Tensor, float]:
    # A copy, so that probing a length-dependent module at a long length leaves the model's state alone.
    probe = copy.deepcopy(module).cpu()
    x = torch.zeros(1, 1, 1, dtype=torch.float32)
    position_ids = torch.tensor([[seq_len - 1]], dtype=torch.long)
    with torch.no_grad():
        probe(x, position_ids)
    # A tensor buffer and a float attribute, which nn.Module types as Tensor | Module.
    inv_freq: torch.Tensor = probe.inv_freq  # type: ignore[assignment]
    return inv_freq.detach().double().cpu(), float(probe.attention_scaling)  # type: ignore[arg-type]


@dataclass
class RopeCheck:
    """The outcome of comparing a model's runtime RoPE with ctxext's reference.

    Attributes:
        ok: everything matched.
        checks: one entry per (module, sequence length) probed.
    """

    ok: bool
    checks: list[dict[str, Any]]

    def summary(self) -> str:
        """A one-line human summary."""
        if self.ok:
            lengths = sorted({c["seq_len"] for c in self.checks})
            return f"runtime RoPE matches the reference ({len(self.checks)} checks at lengths {lengths})"
        bad = [c for c in self.checks if not c["ok"]]
        first = bad[0]
        return (
            f"runtime RoPE of {first['module'] or 'model'} at length {first['seq_len']} differs from the "
            f"reference: max relative inv_freq error {first['max_rel_error']:.3g}, attention scaling "
            f"{first['runtime_attention_scaling']:.6g} vs {first['reference_attention_scaling']:.6g}"
        )


def probe_lengths(state: RopeState) -> list[int]:
    """The sequence lengths at which the runtime RoPE is compared with the reference.

    Args:
        state: the config's RoPE.

    Returns:
        For length-dependent types, a length within the original context and the current one;
        otherwise the current context only.
    """
    if state.rope_type in LENGTH_DEPENDENT_TYPES:
        return sorted({min(state.original_length, state.current_length), state.current_length})
    return [state.current_length]


def check_model_rope(model: torch.nn.Module, lengths: list[int] | None = None) -> RopeCheck:
    """Compare every rotary module's runtime ``inv_freq`` and attention scaling with the reference.

    Args:
        model: a loaded (or meta-built then rebuilt) model.
        lengths: sequence lengths to probe; defaults to :func:`probe_lengths`.

    Returns:
        A :class:`RopeCheck`.
    """
    config = _text_config(model.config)
    state = read_rope(config)
    checks: list[dict[str, Any]] = []
    modules = list(rotary_modules(model))
    if not modules:
        raise RopeError(f"{type(model).__name__} has no rotary embedding module (no inv_freq buffer)")
    for seq_len in lengths or probe_lengths(state):
        ref_freq, ref_scale = reference_rope(state.parameters, state.rotary_dim, state.max_position_embeddings, seq_len)
        for name, module in modules:
            run_freq, run_scale = _runtime_values(module, seq_len)
            if run_freq.shape != ref_freq.shape:
                rel = float("inf")
            else:
                rel = float(((run_freq - ref_freq).abs() / (ref_freq.abs() + _ATOL)).max())
            scale_ok = math.isclose(run_scale, ref_scale, rel_tol=_RTOL)
            checks.append(
                {
                    "module": name,
                    "seq_len": seq_len,
                    "max_rel_error": rel,
                    "runtime_attention_scaling": run_scale,
                    "reference_attention_scaling": ref_scale,
                    "ok": rel <= _RTOL and scale_ok,
                }
            )
    return RopeCheck(ok=all(c["ok"] for c in checks), checks=checks)


def verify_model_rope(model: torch.nn.Module, lengths: list[int] | None = None) -> RopeCheck:
    """Like :func:`check_model_rope`, but raise on a mismatch.

    Args:
        model: the model to verify.
        lengths: sequence lengths to probe.

    Returns:
        The passing :class:`RopeCheck`.

    Raises:
        RopeMismatchError: the runtime RoPE differs from the config's reference.
    """
    state = read_rope(model.config)
    check_rope_parameters(state.parameters, state.rotary_dim, state.max_position_embeddings)
    result = check_model_rope(model, lengths)
    if not result.ok:
        raise RopeMismatchError(
            result.summary()
            + ". The model would silently run with the wrong positions. If you changed model.config after loading, "
            "call ctxext.rope.core.rebuild_rotary(model); if the model uses custom modeling code, it may ignore "
            "rope_parameters."
        )
    return result


def patch_model(  # the parameters after ``model`` are plan_extension's, forwarded unchanged
    model: torch.nn.Module,
    method: str,
    target_length: int,
    options: dict[str, Any] | None = None,
    original_length: int | None = None,
    relative_to: str | None = None,
) -> RopePlan:
    """Extend a loaded model in place: patch its config, rebuild its rotary modules, verify.

    Args:
        model: a transformers causal LM.
        method: a name in :data:`METHODS`.
        target_length: the new context length.
        options: method options.
        original_length: overrides the pretraining length.
        relative_to: how to compose with an existing extension (see :func:`plan_extension`).

    Returns:
        The applied :class:`RopePlan`.
    """
    plan = plan_extension(model.config, method, target_length, options, original_length, relative_to)
    apply_plan(model.config, plan)
    rebuild_rotary(model)
    verify_model_rope(model)
    return plan


def _phase_tolerance(position: int) -> float:
    # transformers computes position × inv_freq in float32: a relative error of a few ulp on a phase
    # of up to ``position`` radians. A wrong factor or base moves phases by O(1) long before that.
    return 1e-5 + 1e-6 * position


def probe_positions(original_length: int, target_length: int) -> list[int]:
    """Positions whose cos/sin are checked: 0, the last original position and the last target position."""
    return sorted({0, max(original_length - 1, 0), max(target_length - 1, 0)})


def check_cos_sin(
    model: torch.nn.Module,
    rope_parameters: dict[str, Any],
    rotary_dim: int,
    max_position_embeddings: int,
    positions: list[int],
) -> RopeCheck:
    """Compare the cos/sin every rotary module hands to attention with the reference of a RoPE setting.

    Each position ``p`` is probed as the last token of a ``p + 1``-token sequence (what length-dependent
    types scale for), on a copy of the module. The reference is ``cos(p·θ_i)·a`` and ``sin(p·θ_i)·a``
    from :func:`reference_rope` of the *given* parameters, so a module that ignores its config, drops
    rotary dimensions, or computes cos/sin from something other than its ``inv_freq`` fails here.

    Args:
        model: a model with rotary modules (possibly a meta skeleton from :func:`runtime_model_from_config`).
        rope_parameters: the intended parameters (a plan's, not the model's config).
        rotary_dim: the intended rotary dimension.
        max_position_embeddings: the intended ``max_position_embeddings``.
        positions: positions to probe.

    Returns:
        A :class:`RopeCheck` with one entry per (module, position).
    """
    checks: list[dict[str, Any]] = []
    modules = list(rotary_modules(model))
    if not modules:
        raise RopeError(f"{type(model).__name__} has no rotary embedding module (no inv_freq buffer)")
    for p in positions:
        inv_freq, att = reference_rope(rope_parameters, rotary_dim, max_position_embeddings, p + 1)
        emb = torch.cat([p * inv_freq, p * inv_freq])
        ref_cos, ref_sin = torch.cos(emb) * att, torch.sin(emb) * att
        for name, module in modules:
            probe = copy.deepcopy(module).cpu()
            with torch.no_grad():
                cos, sin = probe(torch.zeros(1, 1, 1, dtype=torch.float32), torch.tensor([[p]], dtype=torch.long))
            cos, sin = cos.reshape(-1).double(), sin.reshape(-1).double()
            if cos.shape != ref_cos.shape:
                err = float("inf")
            else:
                err = float(max((cos - ref_cos).abs().max(), (sin - ref_sin).abs().max()))
            checks.append(
                {
                    "module": name,
                    "position": p,
                    "seq_len": p + 1,
                    "rotary_dim": int(cos.numel()),
                    "expected_rotary_dim": int(ref_cos.numel()),
                    "max_abs_error": err,
                    "tolerance": _phase_tolerance(p),
                    "ok": err <= _phase_tolerance(p) * max(att, 1.0),
                }
            )
    return RopeCheck(ok=all(c["ok"] for c in checks), checks=checks)


def _cos_sin_summary(check: RopeCheck) -> str:
    bad = next(c for c in check.checks if not c["ok"])
    if bad["rotary_dim"] != bad["expected_rotary_dim"]:
        return (
            f"{bad['module'] or 'the rotary module'} rotates {bad['rotary_dim']} dimensions, the plan "
            f"{bad['expected_rotary_dim']}"
        )
    return (
        f"cos/sin of {bad['module'] or 'the rotary module'} at position {bad['position']} differ from the reference "
        f"by {bad['max_abs_error']:.3g} (tolerance {bad['tolerance']:.3g})"
    )


def verify_against_plan(model: torch.nn.Module, plan: RopePlan) -> str:
    """Verify a model's runtime RoPE against a plan: ``inv_freq`` and the cos/sin at 0, L − 1, T − 1.

    Args:
        model: the model as a user will load it (reloaded from disk).
        plan: the plan it should implement.

    Returns:
        A one-line summary of what was checked.

    Raises:
        RopeMismatchError: the model does not implement the plan.
    """
    text = _text_config(model.config)
    written = read_rope(text)
    if written.rotary_dim != plan.rotary_dim:
        raise RopeMismatchError(
            f"the written config rotates {written.rotary_dim} dimensions per head, the plan {plan.rotary_dim} "
            f"(partial_rotary_factor {written.parameters.get('partial_rotary_factor')!r}); the folder would load "
            "with different positions than planned"
        )
    if (written.original_length, written.current_length) != (plan.original_length, plan.target_length):
        raise RopeMismatchError(
            f"the written config reads as {written.original_length} → {written.current_length} tokens, the plan "
            f"is {plan.original_length} → {plan.target_length}"
        )
    positions = probe_positions(plan.original_length, plan.target_length)
    freq = RopeCheck(ok=True, checks=[])
    for seq_len in sorted({plan.original_length, plan.target_length}):
        ref_freq, ref_scale = reference_rope(
            plan.rope_parameters, plan.rotary_dim, plan.max_position_embeddings, seq_len
        )
        for name, module in rotary_modules(model):
            run_freq, run_scale = _runtime_values(module, seq_len)
            same = (
                run_freq.shape == ref_freq.shape
                and float(((run_freq - ref_freq).abs() / (ref_freq.abs() + _ATOL)).max()) <= _RTOL
                and math.isclose(run_scale, ref_scale, rel_tol=_RTOL)
            )
            freq.checks.append({"module": name, "seq_len": seq_len, "ok": same})
    freq.ok = all(c["ok"] for c in freq.checks)
    if not freq.ok:
        bad = next(c for c in freq.checks if not c["ok"])
        raise RopeMismatchError(
            f"the runtime inv_freq / attention scaling of {bad['module'] or 'the rotary module'} at length "
            f"{bad['seq_len']} differ from the plan ({plan.method} ×{plan.factor:g})"
        )
    cos_sin = check_cos_sin(model, plan.rope_parameters, plan.rotary_dim, plan.max_position_embeddings, positions)
    if not cos_sin.ok:
        raise RopeMismatchError(_cos_sin_summary(cos_sin) + f" (plan: {plan.method} ×{plan.factor:g})")
    return (
        f"runtime RoPE matches the plan ({plan.method} ×{plan.factor:g}): inv_freq at lengths "
        f"{sorted({plan.original_length, plan.target_length})}, cos/sin at positions {positions}"
    )


def intent_problems(state: RopeState, model: torch.nn.Module | None = None) -> dict[str, str]:
    """Disagreements between what a config states and what transformers will run.

    - the dynamic-NTK trap: ``max_position_embeddings`` above the pretraining length, so positions up
      to it run unscaled (transformers starts dynamic scaling there);
    - a YaRN / llama3 / longrope factor that disagrees with ``max_position_embeddings / original``;
    - rotary modules whose cos/sin (at 0, L − 1, T − 1) do not match the config's reference.

    Args:
        state: from :func:`read_rope` (ctxext's ``config.ctxext`` record counts as stated intent).
        model: a model (or meta skeleton) whose rotary modules are probed; ``None`` skips that check.

    Returns:
        ``{field: problem}``; empty when config and runtime agree.
    """
    problems: dict[str, str] = {}
    meta = state.extension
    if state.rope_type == "dynamic":
        stated_original = meta.get("original_length")
        if stated_original is not None and int(stated_original) < state.max_position_embeddings:
            problems["max_position_embeddings"] = (
                f"dynamic NTK scales only beyond max_position_embeddings ({state.max_position_embeddings}), but the "
                f"original context is {stated_original}: positions {stated_original}–{state.max_position_embeddings} "
                f"run unscaled (extrapolated). Set max_position_embeddings to {stated_original}."
            )
    if state.rope_type in ("yarn", "llama3", "longrope") and state.parameters.get("factor"):
        original = int(state.parameters["original_max_position_embeddings"])
        implied = state.factor * original
        max_pos = state.max_position_embeddings
        if max_pos > original and not math.isclose(implied, max_pos, rel_tol=0.01):
            problems["rope_parameters.factor"] = (
                f"{state.rope_type} factor {state.factor:g} scales the original {original} tokens to {implied:g}, but "
                f"max_position_embeddings says {max_pos} (factor {max_pos / original:g}); one of them is wrong. "
                f"Re-extend with `ctxext extend --target-length N --relative-to original`."
            )
    if model is not None and not problems:
        positions = probe_positions(state.original_length, state.current_length)
        try:
            check = check_cos_sin(model, state.parameters, state.rotary_dim, state.max_position_embeddings, positions)
        except RopeError as exc:
            problems["runtime"] = str(exc)
        else:
            if not check.ok:
                problems["runtime cos/sin"] = _cos_sin_summary(check) + " (reference: the config's RoPE)"
    return problems


def runtime_model_from_config(config: Any) -> torch.nn.Module:
    """Build a model's skeleton without weights, with real rotary modules, to check a config's runtime RoPE.

    The model is created on the meta device (no memory for weights); only its rotary modules are
    then rebuilt on the CPU. This is how ``ctxext inspect --config-only`` and ``ctxext extend``
    check a model without loading it.

    Args:
        config: a transformers config.

    Returns:
        A model on the meta device whose rotary modules live on the CPU.
    """
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    config_text = _text_config(model.config)
    for name, module in list(rotary_modules(model)):
        try:
            fresh = type(module)(config=config_text, device=torch.device("cpu"))
        except TypeError:
            with torch.device("cpu"):
                fresh = type(module)(config=config_text)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, fresh)
    return model


def wavelengths(state: RopeState, seq_len: int | None = None) -> torch.Tensor:
    """Wavelengths ``2π / inv_freq`` (in tokens) of the config's RoPE at a sequence length.

    Args:
        state: the config's RoPE.
        seq_len: length for length-dependent types.

    Returns:
        A float64 tensor of ``d/2`` wavelengths.
    """
    inv_freq, _ = reference_rope(state.parameters, state.rotary_dim, state.max_position_embeddings, seq_len)
    return 2 * math.pi / inv_freq
